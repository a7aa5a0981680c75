"""``fit(compile=...)``: the model compiled with ``torch.compile``, its compile caches
carried from one session to the next, the shapes that would recompile run eagerly, and a
compile that fails or gives up said in one line.

- What is compiled: ``"whole"`` the model; ``"regional"`` each of its repeated blocks (the
  layers of a transformer: one compiled graph serves them all, so the first compile is far
  shorter); ``True`` regional where the model has repeated blocks, else whole. For the run,
  each compiled module's ``forward`` is its compiled version (the state dict, the
  checkpoints and the parameters the optimizer holds stay those of the model); after it,
  the model is given its own ``forward`` back.
- The caches: torch keeps what it compiled in a temporary folder lost with the machine.
  With a checkpoint folder, fit saves them there after the first step and at the end, in
  one tar named for this torch, Python and device: the caches torch hands out as bytes
  (``torch.compiler.save_cache_artifacts``) and the kernels its compiler built (which the
  bytes alone would build again, most of a cold start on a CPU). The next session loads
  that file first: its first step neither compiles the kernels nor builds them.
- Recompiles: a batch whose size is not the training batch size (the last partial batch)
  and validation (the model in eval mode) run eagerly, each would otherwise compile again.
  When torch gives up recompiling a function (its ``recompile_limit``), fit says so.
- Failures: a step that fails compiled is run again eagerly; if that works, the run goes
  on eagerly and says why in one line; if it fails too, that error is the user's.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ipycloud.runtime.durable import write_atomically
from ipycloud.runtime.machine.build_support import compile_problem
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.train.batches import batch_size

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
CHOICES = (False, True, "whole", "regional")
CACHE_FOLDER = "compile-cache"
ARTIFACTS, BUILT = "artifacts.bin", "built"  # the cache file's entries
_DYNAMO_LOGGER = "torch._dynamo"
_GAVE_UP = re.compile(r"hit config\.(\w+) \((\d+)\)\s+function: '([^']+)'")


def check_compile(value: Any, device: torch.device, device_kind: str) -> None:
    """ValueError, in one line, for a ``compile`` fit cannot do on ``device``."""
    if value not in CHOICES or not isinstance(value, bool | str):
        raise ValueError(f"compile must be False, True (regional where the model repeats "
                         f"blocks, else whole), 'whole' or 'regional', not {value!r}")
    if value is False:
        return
    if device_kind not in ("cuda", "cpu"):
        raise ValueError(f"compile runs on CUDA GPUs and CPUs, not on {device_kind} "
                         "devices: leave compile off")
    if device_kind == "cuda":
        from ipycloud.runtime.train.precision import cuda_capability

        name, capability = cuda_capability(device)
        problem = compile_problem(name, capability)
        if problem is not None:
            raise ValueError(problem)


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's longest run of alike blocks inside a ModuleList or Sequential (a
    transformer's layers), when there are two or more; else none. Alike: modules of one
    class with submodules of their own and parameters of the same shapes."""
    import torch

    best: list[torch.nn.Module] = []
    for module in model.modules():
        if not isinstance(module, torch.nn.ModuleList | torch.nn.Sequential):
            continue
        kinds = Counter(_structure(child) for child in module.children()
                        if any(True for _ in child.children()))
        if not kinds:
            continue
        kind, count = kinds.most_common(1)[0]
        if count >= 2 and count > len(best):
            best = [child for child in module.children() if _structure(child) == kind]
    return best


def _structure(module: torch.nn.Module) -> tuple[Any, ...]:
    """What alike blocks share: their class and the names and shapes of their parameters."""
    return (type(module), *((name, tuple(parameter.shape))
                            for name, parameter in module.named_parameters()))


def cache_file(folder: Path, device: torch.device) -> Path:
    """Where this torch, Python and device keep their compile caches in ``folder``."""
    import torch

    if device.type == "cuda":
        from ipycloud.runtime.train.precision import cuda_capability

        name, (major, minor) = cuda_capability(device)
        where = f"{name}-sm{major}{minor}"
    else:
        where = device.type
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = re.sub(r"[^A-Za-z0-9.+-]+", "_", f"torch-{torch.__version__}-{python}-{where}")
    return folder / CACHE_FOLDER / f"{key}.tar"


class CompiledModel:
    """One run's compiled model: its caches, the stance of each step, and what it says."""

    def __init__(self, model: torch.nn.Module, choice: bool | str, cache: Path | None,
                 say: Callable[[str], None]) -> None:
        self.cache, self.say = cache, say
        blocks = repeated_blocks(model) if choice in (True, "regional") else []
        self.mode = "regional" if blocks else "whole"
        self.compiled = blocks or [model]
        self.eager = False  # after a failure, every later step
        self.steady_size: int | None = None  # the training batch size, from the first batch
        self.saved_size = 0  # bytes of artifacts in the cache file we wrote last
        self.first_saved = False  # whether the caches were saved after the first step
        self.forwards: list[tuple[torch.nn.Module, Any]] = []  # what each forward was
        self.gave_up: list[str] = []  # functions torch stopped recompiling
        self._listener = _GaveUpListener(self.gave_up)

    def start(self) -> str:
        """Load the saved caches, compile, and listen for torch giving up; how it started."""
        import torch

        loaded = self._load()
        for module in self.compiled:
            # The forward of this instance (``nn.Module.compile`` compiles ``_call_impl``,
            # which torch 2.13 leaves untraced); the state dict is untouched.
            self.forwards.append((module, module.__dict__.get("forward")))
            module.forward = torch.compile(module.forward)
        logging.getLogger(_DYNAMO_LOGGER).addHandler(self._listener)
        what = (f"{len(self.compiled)} repeated blocks ({type(self.compiled[0]).__name__})"
                if self.mode == "regional" else "the whole model")
        source = f"from the caches saved in {self.cache.parent}" if loaded and self.cache \
            else "with no saved caches"
        return f"compiling {what}, {source}"

    def step(self, batch: Any, run: Callable[[], T]) -> T:
        """``run()``, this batch's forward and backward, compiled or eagerly as decided;
        a compiled one that fails is run again eagerly, and the run goes on eagerly."""
        size = batch_size(batch)
        if self.steady_size is None:
            self.steady_size = size
        if self.eager or size != self.steady_size:
            return self.eagerly(run)
        try:
            result = run()
        except Exception as error:
            result = self.eagerly(run)  # the user's error, when it fails again
            self.eager = True
            self._restore()
            self.say(f"ipycloud.fit: compile failed ({describe_error(error)}); training "
                     "eagerly from here on")
            return result
        if not self.first_saved:  # the training graphs are compiled now: keep them
            self.first_saved = True
            self.save()
        return result

    def eagerly(self, run: Callable[[], T]) -> T:
        """``run()`` with the compiled code set aside (validation, odd batch sizes)."""
        import torch

        with torch.compiler.set_stance("force_eager"):
            return run()

    def save(self) -> None:
        """Write torch's compile caches to the cache file when they grew since: one tar of
        the caches torch hands out as bytes and of its compiler's cache folder (the built
        kernels, which the bytes alone would have compiled again)."""
        if self.cache is None or self.eager:
            return
        import torch

        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None or len(artifacts[0]) <= self.saved_size:
            return
        packed = _packed(artifacts[0], Path(_compiler_cache_folder()))
        try:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.cache, lambda file: file.write(packed))
        except OSError as error:
            self.say(f"ipycloud.fit: the compile caches were not saved ({describe_error(error)})"
                     "; the next session compiles afresh")
            self.cache = None
            return
        self.saved_size = len(artifacts[0])

    def finish(self) -> None:
        """At the run's end: save the caches, give the model its own forward back, stop
        listening, say where torch gave up."""
        self.save()
        self._restore()
        logging.getLogger(_DYNAMO_LOGGER).removeHandler(self._listener)
        for line in dict.fromkeys(self.gave_up):
            self.say(f"ipycloud.fit: {line}")

    def _restore(self) -> None:
        """The compiled modules' forwards as they were before the run."""
        for module, forward in self.forwards:
            if forward is None:
                del module.forward
            else:
                module.forward = forward
        self.forwards = []

    def _load(self) -> bool:
        if self.cache is None or not self.cache.is_file():
            return False
        import torch

        try:
            with tarfile.open(self.cache) as saved:
                data = _read_tar(saved, Path(_compiler_cache_folder()))
            torch.compiler.load_cache_artifacts(data)
        except Exception as error:
            self.say(f"ipycloud.fit: the compile caches in {self.cache} cannot be loaded "
                     f"({describe_error(error)}); compiling afresh")
            return False
        return True


def _compiler_cache_folder() -> str:
    """The folder where torch's compiler keeps what it built (TORCHINDUCTOR_CACHE_DIR)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def _packed(artifacts: bytes, built: Path) -> bytes:
    """The cache file's bytes: a tar of the artifacts and of the compiler's built files."""
    file = io.BytesIO()
    with tarfile.open(fileobj=file, mode="w") as saved:
        entry = tarfile.TarInfo(ARTIFACTS)
        entry.size = len(artifacts)
        saved.addfile(entry, io.BytesIO(artifacts))
        for path in sorted(built.rglob("*")):
            relative = path.relative_to(built)
            if path.is_file() and relative.parts[0] != "locks":
                saved.add(path, f"{BUILT}/{relative.as_posix()}", recursive=False)
    return file.getvalue()


def _read_tar(saved: tarfile.TarFile, built: Path) -> bytes:
    """The artifacts' bytes; the compiler's built files go back into ``built``."""
    artifacts = saved.extractfile(ARTIFACTS)
    if artifacts is None:
        raise ValueError(f"no {ARTIFACTS} in it")
    prefix = f"{BUILT}/"
    for member in saved.getmembers():
        if member.isfile() and member.name.startswith(prefix):
            member.name = member.name[len(prefix):]
            saved.extract(member, built, filter="data")
    return artifacts.read()


class _GaveUpListener(logging.Handler):
    """Notes each warning of torch's that it stopped recompiling a function."""

    def __init__(self, notes: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.notes = notes

    def emit(self, record: logging.LogRecord) -> None:
        found = _GAVE_UP.search(record.getMessage())
        if found:
            limit, count, function = found.groups()
            self.notes.append(f"compile gave up on {function} after {count} recompiles "
                              f"(torch._dynamo.config.{limit}): it runs eagerly from there; "
                              "give its inputs steady shapes")
