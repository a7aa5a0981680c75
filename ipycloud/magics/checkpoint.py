"""``%checkpoint``: save, list, restore and auto-save the training state of notebook variables."""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import Int, Unicode, default

from ipycloud.magics._arguments import (
    duration,
    expand_home,
    help_option,
    parse_line,
    refuse_options,
    user_path,
)
from ipycloud.magics._display import Notice
from ipycloud.magics._storage_errors import storage_problem, storage_remedy
from ipycloud.runtime.checkpoint.catalog import MAX_STEP
from ipycloud.runtime.durable import refuse_a_file

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ipycloud.runtime.checkpoint import CheckpointManager

ACTIONS = ("save", "restore", "list", "auto")
# The options each use of the magic takes; any other option given is refused.
OPTIONS = {
    "save": {"folder", "step", "tag", "background"},
    "restore": {"folder", "which", "strict", "best_by"},
    "list": {"folder"},
    "auto": {"folder", "every"},
    "auto --off": {"off"},
}
AUTO_EVERY = "10m"
# The runtime's words for its parameters, and this magic's for the same choice.
SPELLINGS = {"strict=False": "--no-strict", "which='best'": "--from best"}
WORDS = {"best": "--from best", "best_by": "--best-by METRIC[:min|max]"}


def ranking(text: str) -> tuple[str, str]:
    """An argparse type: ``val_loss`` or ``val_loss:min`` (lower is better; the default),
    ``val_acc:max``."""
    metric, _, mode = text.partition(":")
    if not metric or mode not in ("", "min", "max"):
        raise argparse.ArgumentTypeError(f"give METRIC, METRIC:min or METRIC:max, not {text!r}")
    return metric, mode or "min"


def step_number(text: str) -> int:
    """An argparse type: a step number from 0 to MAX_STEP."""
    try:
        step = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 0 <= step <= MAX_STEP:
        raise argparse.ArgumentTypeError(
            f"step must be from 0 to {MAX_STEP} (checkpoint names hold nine digits), not {step}")
    return step


@magics_class
class CheckpointMagics(Magics):
    """Checkpoints of notebook variables: durable, rotated, verified, resumable bit for bit."""

    directory = Unicode(
        "", help="Folder for checkpoints; empty: <platform persistent folder>/checkpoints/"
                 "<the notebook's name>, or .../default where the name is not known"
    ).tag(config=True)
    keep_last = Int(help="How many of the newest checkpoints to keep (default: the "
                         "runtime's KEEP_LAST)").tag(config=True)

    @default("keep_last")
    def _keep_last_default(self) -> int:
        from ipycloud.runtime.checkpoint import KEEP_LAST  # on first use, not at %load_ext

        return KEEP_LAST

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._hook_registered = False

    @help_option
    @magic_arguments()
    @argument("action", choices=ACTIONS, help="what to do")
    @argument("names", nargs="*", help="notebook variables: model, optimizer, scheduler, ...")
    @argument("--dir", dest="folder", type=user_path,
              help="checkpoint folder (default: see %%config CheckpointMagics.directory)")
    @argument("--step", type=step_number,
              help="step number to record (save; default: the next one)")
    @argument("--tag", help="a name to keep this checkpoint by; tagged ones are never rotated")
    @argument("--async", dest="background", action="store_true",
              help="copy the state and write it in the background (save)")
    @argument("--from", dest="which",
              help="latest (default), a step number, or a tag (restore)")
    @argument("--best-by", type=ranking, metavar="METRIC[:min|max]",
              help="with --from best: the metric that ranks the checkpoints, lower is better "
                   "unless :max (default: the keep_best rule they were saved with)")
    @argument("--no-strict", dest="strict", action="store_false",
              help="restore what the checkpoint holds and skip the rest: missing "
                   "variables, and module keys missing or unexpected (restore)")
    @argument("--every", type=duration,
              help=f"how often auto saves: 90s, 10m, 1h (auto; default {AUTO_EVERY})")
    @argument("--off", action="store_true", help="stop automatic checkpoints (auto)")
    @line_magic
    def checkpoint(self, line: str = "") -> Any:
        """Save, list and restore the training state of notebook variables.

        A checkpoint holds each named variable's state (modules, optimizers, LR
        schedulers, GradScaler, tensors, torch Generators, plain values) plus the random
        generator states of Python, NumPy, torch, CUDA and XLA, so a restored run
        continues exactly as the uninterrupted one would. Files are written under a
        temporary name, fsynced and renamed: a kernel that dies mid-save leaves the
        previous checkpoint intact. Old checkpoints are rotated away only after the new
        one is complete. Loading is safe: weights only, no code from the file runs.

        Examples
        --------
        Save after some training, with the step number::

            %checkpoint save model optimizer scheduler --step 1200

        Save in the background and keep training::

            %checkpoint save model optimizer --async

        Keep a checkpoint by name, then list them::

            %checkpoint save model --tag before-finetune
            %checkpoint list

        Restore the newest valid checkpoint, or a given step or tag; ``--no-strict``
        restores what the checkpoint holds and leaves the rest as it is::

            %checkpoint restore model optimizer scheduler
            %checkpoint restore model --from before-finetune
            %checkpoint restore model --from best --best-by val_loss
            %checkpoint restore model optimizer --no-strict

        Without ``--dir``, checkpoints go to ``<persistent folder>/checkpoints/<notebook>``,
        a folder per notebook where Jupyter or VS Code names the notebook.

        Words are split as a shell splits them: quote a folder whose name has spaces
        (IPython puts in ``$name`` first)::

            %checkpoint save model --dir "/content/drive/MyDrive/my runs"
            %checkpoint list --dir "$folder"

        Save automatically every 10 minutes (after cells, in ipycloud training loops,
        and when the session is about to end)::

            %checkpoint auto model optimizer --every 10m
            %checkpoint auto --off
        """
        args = parse_line(self.checkpoint, line)
        from ipycloud.runtime.checkpoint import CheckpointError
        from ipycloud.runtime.messages import in_words

        use = "auto --off" if args.action == "auto" and args.off else args.action
        refuse_options(self.checkpoint, args, OPTIONS[use], use)
        actions = {"save": self._save, "restore": self._restore, "list": self._list,
                   "auto": self._auto}
        try:
            return actions[args.action](args)
        except (CheckpointError, ValueError, ImportError) as error:
            text = in_words(error, WORDS)
            for python, option in SPELLINGS.items():
                text = text.replace(python, option)
            remedy = storage_remedy(error, "--dir")
            raise UsageError(f"%checkpoint {args.action}: {text}"
                             + (f"; {remedy}" if remedy else "")) from None
        except OSError as error:
            problem = storage_problem(f"the folder {self._folder(args.folder)}", error, "--dir")
            raise UsageError(f"%checkpoint {args.action}: {problem}") from None
        except RecursionError:  # from walking the state: a value that holds itself
            raise UsageError(f"%checkpoint {args.action}: a value in {', '.join(args.names)} "
                             "nests too deeply or holds itself, which a checkpoint cannot "
                             "store; save it without the cycle") from None

    # -- actions -----------------------------------------------------------------------------

    def _save(self, args: argparse.Namespace) -> Any:
        state = self._variables(args.names, "save")
        manager = self._manager(args.folder)
        _refuse_a_file(manager.directory)
        step = manager.next_step() if args.step is None else args.step
        info = manager.save(state, step, tag=args.tag, blocking=not args.background)
        if info is None:
            return Notice(f"saving step {step} of {', '.join(state)} in the background into "
                          f"{manager.directory}; the next save or %checkpoint list waits for it")
        return info

    def _restore(self, args: argparse.Namespace) -> Notice:
        from ipycloud.runtime.checkpoint.restore import UNDEFINED

        state = self._variables(args.names, "restore", undefined=UNDEFINED)
        manager = self._existing_manager(args.folder)
        chosen = args.which or "latest"
        which: str | int = int(chosen) if chosen.isdecimal() else chosen
        if args.best_by and which != "best":
            raise UsageError("%checkpoint restore: --best-by goes with --from best")
        info = manager.load(state, which, strict=args.strict, best_by=args.best_by)
        restored = [name for name in state if name in info.objects]
        # plain values come back as new objects, defined or not before
        self._ipython.user_ns.update({name: state[name] for name in restored})
        text = f"restored {', '.join(restored) or 'nothing'} from {info.summary()}"
        kept = [name for name in state if name not in restored and state[name] is not UNDEFINED]
        undefined = [name for name in state if name not in restored and name not in kept]
        if kept:
            text += f"; not in it, left as they were: {', '.join(kept)}"
        if undefined:
            text += f"; not in it, still undefined: {', '.join(undefined)}"
        return Notice(text)

    def _list(self, args: argparse.Namespace) -> Any:
        if args.names:
            raise UsageError(f"%checkpoint list takes no variable names (got "
                             f"{' '.join(args.names)}); use --dir to pick a folder")
        return self._existing_manager(args.folder).table()

    def _auto(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.checkpoint import auto

        if args.off:
            if args.names:
                raise UsageError("%checkpoint auto --off takes no variable names (got "
                                 f"{' '.join(args.names)})")
            previous = auto.unregister()
            return Notice("automatic checkpoints stopped" if previous
                          else "no automatic checkpoint was registered")
        if not args.names:
            current = auto.registered()
            if current is None or args.folder or args.every:
                raise UsageError("%checkpoint auto: name the variables to save, e.g. "
                                 "%checkpoint auto model optimizer --every 10m")
            return current
        self._variables(args.names, "auto")  # they must exist now
        names = tuple(args.names)
        manager = self._manager(args.folder)
        _refuse_a_file(manager.directory)
        _check_writable(manager.directory)  # the saves come later: a mistake is said now
        registration = auto.AutoCheckpoint(
            manager=manager, collect=lambda: self._variables(names, "auto"),
            names=names, every_s=args.every or duration(AUTO_EVERY))
        auto.register(registration)
        if not self._hook_registered:
            self._ipython.events.register("post_run_cell", self._after_cell)
            self._hook_registered = True
        return registration

    # -- helpers -----------------------------------------------------------------------------

    @property
    def _ipython(self) -> InteractiveShell:
        if self.shell is None:
            raise UsageError("%checkpoint works only inside an IPython shell")
        return self.shell

    def _after_cell(self, result: Any) -> None:
        """Save the registered objects when a save is due; failures are shown, not raised."""
        from ipycloud.runtime.checkpoint import auto
        from ipycloud.runtime.messages import describe_error

        registration = auto.registered()
        if registration is None:
            return
        try:
            info = registration.maybe_save()
        except Exception as error:  # shown in the notebook, never swallowed
            print(f"ipycloud: automatic checkpoint failed: {describe_error(error)}")
            return
        if info is not None:
            print(f"ipycloud: automatic {info.summary()}")

    def _variables(self, names: list[str] | tuple[str, ...], action: str,
                   undefined: Any = None) -> dict[str, Any]:
        """The named notebook variables; a name not defined in the notebook is refused, or
        given the value ``undefined`` where that is not None."""
        from ipycloud.runtime._optional import require
        from ipycloud.runtime.checkpoint.state import kind_of

        require("torch", "torch")
        if not names:
            raise UsageError(f"%checkpoint {action}: name the variables, e.g. "
                             f"%checkpoint {action} model optimizer")
        repeated = [name for index, name in enumerate(names) if name in names[:index]]
        if repeated:
            raise UsageError(f"%checkpoint {action}: {repeated[0]} is named twice: name each "
                             "variable once")
        namespace = self._ipython.user_ns
        state = {}
        for name in names:
            if name not in namespace and undefined is not None:
                state[name] = undefined
                continue
            if name not in namespace:
                raise UsageError(f"%checkpoint {action}: no variable named {name!r} in the "
                                 "notebook; define it first or check the spelling")
            if kind_of(namespace[name]) is None:
                raise UsageError(
                    f"%checkpoint {action}: {name!r} is a {type(namespace[name]).__name__} "
                    "without state_dict(); checkpoint modules, optimizers, schedulers, "
                    "scalers, tensors or plain values")
            state[name] = namespace[name]
        return state

    def _folder(self, folder: str | None) -> Path:
        """The folder of ``--dir`` (its ``~`` already expanded), else the configured one."""
        from ipycloud.runtime.checkpoint import default_directory

        if folder:
            return Path(folder)
        if not self.directory:
            return default_directory(self._notebook(), option="--dir")
        try:
            return Path(expand_home(self.directory))
        except ValueError as error:
            raise ValueError(f"CheckpointMagics.directory: {error}") from None

    def _notebook(self) -> str:
        """The notebook's file name without ``.ipynb``, so each notebook gets a folder of
        its own: as Jupyter's server (``JPY_SESSION_NAME``) or VS Code
        (``__vsc_ipynb_file__``) names it; "default" where neither does."""
        named = (os.environ.get("JPY_SESSION_NAME")
                 or self._ipython.user_ns.get("__vsc_ipynb_file__") or "")
        stem = Path(str(named)).name.removesuffix(".ipynb")
        return stem if stem and not stem.startswith(".") else "default"

    def _manager(self, folder: str | None) -> CheckpointManager:
        from ipycloud.runtime.checkpoint import manager_for

        return manager_for(self._folder(folder), keep_last=self.keep_last)

    def _existing_manager(self, folder: str | None) -> CheckpointManager:
        manager = self._manager(folder)
        manager.wait()  # a save still being written counts
        _refuse_a_file(manager.directory)
        if _is_folder(manager.directory) is None:
            raise UsageError(f"%checkpoint: the folder {manager.directory} does not exist; "
                             "save a checkpoint first, or give the right one with --dir")
        if not manager.list():
            raise UsageError(f"%checkpoint: no checkpoint in {manager.directory} yet; save "
                             "one with %checkpoint save model optimizer")
        return manager


def _is_folder(folder: Path) -> bool | None:
    """Whether ``folder`` is a folder; None when nothing is there. Any other trouble (a name
    too long, a lost mount) raises its OSError, where ``Path.exists`` would say False."""
    try:
        return stat.S_ISDIR(folder.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _refuse_a_file(folder: Path) -> None:
    """ValueError when ``folder``, or a folder above it, is a file."""
    try:
        refuse_a_file(folder)
    except NotADirectoryError as error:
        raise ValueError(f"{error}; give a folder with --dir") from None


def _check_writable(folder: Path) -> None:
    """Make ``folder`` if it is missing and create a file in it (removed at once); OSError
    when either cannot be done."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass
