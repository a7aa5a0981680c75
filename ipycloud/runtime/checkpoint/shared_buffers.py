"""Host copies of a state in one shared-memory region, and pickles that refer into it.

A checkpoint writer in another process reads the tensors straight from the region: what
crosses the socket is the state's structure, with each tensor replaced by its place in
the region. The region is an anonymous memory file (Linux ``memfd_create``); its
descriptor is passed to the writer once, and again only when the state's layout changes.
A forked child (a DataLoader worker) keeps no descriptor of it.
"""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import os
import pickle
import weakref
from typing import Any, NamedTuple

from ipycloud.runtime.checkpoint.state import map_tensors

_ALIGNMENT = 64  # every tensor starts on a cache line, as torch's own allocations do


class TensorRef(NamedTuple):
    """Where a tensor lies in the region: byte offset, dtype name, shape."""

    offset: int
    dtype: str
    shape: tuple[int, ...]


def supported() -> bool:
    """Whether this system has anonymous memory files (Linux)."""
    return hasattr(os, "memfd_create")


def in_region(tensor: Any) -> bool:
    """Whether a tensor can be kept in the region: dense, in host memory, not empty."""
    import torch

    return (tensor.device.type == "cpu" and tensor.layout == torch.strided
            and not tensor.is_quantized and tensor.numel() > 0)


class SharedHostBuffers:
    """Host copies of a state's tensors in one shared region, reused from save to save.

    The region keeps its layout while every tensor keeps its place in the state, shape and
    dtype, so steady-state saves allocate nothing. ``fd`` is the region's descriptor and
    ``generation`` counts the regions made, so a reader knows when to map a new one.
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        self.generation = 0
        self._layout: dict[tuple[Any, ...], TensorRef] = {}
        self._views: dict[tuple[Any, ...], Any] = {}
        self._region: mmap.mmap | None = None
        self._mapped_fd: int | None = None  # the region's mapping's own copy of ``fd``
        self._base = 0
        self._closer: weakref.finalize[Any, SharedHostBuffers] | None = None
        _live.add(self)

    def copy(self, value: Any) -> Any:
        """A copy of ``value`` whose tensors live in the region (a new one if needed)."""
        placed: dict[tuple[Any, ...], Any] = {}
        misfits: list[tuple[Any, ...]] = []

        def copy_in(tensor: Any, path: tuple[Any, ...]) -> Any:
            if not in_region(tensor):
                return tensor.detach().clone()
            placed[path] = tensor
            view = self._views.get(path)
            if view is None or view.shape != tensor.shape or view.dtype != tensor.dtype:
                misfits.append(path)
                return tensor
            view.copy_(tensor.detach())
            return view

        copied = map_tensors(value, copy_in)
        if not misfits and placed.keys() == self._views.keys():
            return copied
        self._allocate(placed)  # a new layout: the state's tensors changed
        return map_tensors(value, copy_in)

    def dumps(self, value: Any) -> bytes:
        """Pickle ``value`` (a result of ``copy``), its region tensors as TensorRefs."""
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = self._reference  # type: ignore[method-assign]
        pickler.dump(value)
        return buffer.getvalue()

    def _reference(self, obj: Any) -> TensorRef | None:
        import torch

        if not isinstance(obj, torch.Tensor) or self._region is None:
            return None
        offset = obj.data_ptr() - self._base
        if not 0 <= offset < len(self._region) or not in_region(obj):
            return None
        return TensorRef(offset, _dtype_name(obj.dtype), tuple(obj.shape))

    def _allocate(self, tensors: dict[tuple[Any, ...], Any]) -> None:
        layout: dict[tuple[Any, ...], TensorRef] = {}
        size = 0
        for path, tensor in tensors.items():
            layout[path] = TensorRef(size, _dtype_name(tensor.dtype), tuple(tensor.shape))
            size += -(-tensor.numel() * tensor.element_size() // _ALIGNMENT) * _ALIGNMENT
        fd = os.memfd_create("ipycloud-checkpoint", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(size, 1))
            region = mmap.mmap(fd, max(size, 1))
        except BaseException:
            os.close(fd)
            raise
        self.close()
        self._closer = weakref.finalize(self, _close_in, os.getpid(), fd)  # if never closed
        self.fd, self.generation = fd, self.generation + 1
        self._region, self._layout = region, layout
        self._mapped_fd = _copy_of(fd)
        self._views = {path: tensor_view(region, ref) for path, ref in layout.items()}
        self._base = tensor_view(region, TensorRef(0, "uint8", (1,))).data_ptr()

    def close(self) -> None:
        """Let go of the region's descriptor (views already handed out stay valid)."""
        if self._closer is not None:
            self._closer()
        self.fd, self._closer = None, None


def _copy_of(fd: int) -> int | None:
    """Another descriptor of this process open on the same file as ``fd``: the one an
    ``mmap`` object keeps (Python duplicates the descriptor it maps)."""
    inode = os.fstat(fd).st_ino
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            if int(name) != fd and os.stat(f"/proc/self/fd/{name}").st_ino == inode:
                return int(name)
    return None


def _close_in(owner: int, fd: int) -> None:
    """Close a region's descriptor, unless this is a forked child (it closed its copy)."""
    if os.getpid() == owner:
        os.close(fd)


_live: weakref.WeakSet[SharedHostBuffers] = weakref.WeakSet()


def _forget_regions_in_child() -> None:
    """Right after a fork, in the child: close the region's descriptors it inherited.

    The mapping's own copy is pointed at /dev/null rather than closed, since its mmap
    object will close that number when it goes (the region's memory stays mapped).
    """
    live = [buffers for buffers in _live if buffers.fd is not None]
    if not live:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for buffers in live:
            os.close(buffers.fd)  # type: ignore[arg-type]
            if buffers._mapped_fd is not None:
                os.dup2(null, buffers._mapped_fd)
            buffers.fd, buffers._closer = None, None
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_regions_in_child)


def tensor_view(region: mmap.mmap, ref: TensorRef) -> Any:
    """The tensor at ``ref`` in ``region``, sharing its memory, with a storage of its own."""
    import torch

    dtype = getattr(torch, ref.dtype)
    count = math.prod(ref.shape)
    return torch.frombuffer(region, dtype=dtype, count=count, offset=ref.offset).view(ref.shape)


def loads(data: bytes, region: mmap.mmap | None) -> Any:
    """Unpickle what ``SharedHostBuffers.dumps`` made, its TensorRefs as views of ``region``."""
    unpickler = pickle.Unpickler(io.BytesIO(data))

    def resolve(ref: Any) -> Any:
        if region is None:
            raise pickle.UnpicklingError("a tensor refers to a shared region never received")
        return tensor_view(region, TensorRef(*ref))

    unpickler.persistent_load = resolve  # type: ignore[method-assign]
    return unpickler.load()


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
