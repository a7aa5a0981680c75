"""Host copies of a state in one shared-memory region, and pickles that refer into it.

A checkpoint writer in another process reads the tensors straight from the region: what
crosses the socket is the state's structure, with each tensor replaced by its place in
the region. The region is an anonymous memory file (Linux ``memfd_create``); its
descriptor is passed to the writer once, and again only when the state's layout changes.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import pickle
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
        self._base = 0

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
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.generation = fd, self.generation + 1
        self._region, self._layout = region, layout
        self._views = {path: tensor_view(region, ref) for path, ref in layout.items()}
        self._base = tensor_view(region, TensorRef(0, "uint8", (1,))).data_ptr()

    def close(self) -> None:
        """Let go of the region's descriptor (views already handed out stay valid)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
