"""Note the notebook cell after which torch had first initialised CUDA, for the messages
that must say where it happened (``launch``). One check of torch's state after each cell,
until it is seen; nothing outside an IPython shell."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ipycloud.runtime.machine.cuda_start import cuda_initialised, note_cuda_started

if TYPE_CHECKING:
    from IPython.core.interactiveshell import ExecutionResult, InteractiveShell

BEFORE_IMPORT = "before ipycloud was imported"


def watch_cuda_start() -> None:
    """In an IPython shell, note the first cell after which CUDA is initialised."""
    shell = _shell()
    if shell is None:
        return
    if cuda_initialised():
        note_cuda_started(BEFORE_IMPORT)
        return

    def after_cell(result: ExecutionResult) -> None:
        if cuda_initialised():
            note_cuda_started(cell_name(result))
            shell.events.unregister("post_run_cell", after_cell)

    shell.events.register("post_run_cell", after_cell)


def cell_name(result: ExecutionResult) -> str:
    """``cell In [3] (x = torch.ones(1).cuda())``, as much of it as is known."""
    from ipycloud.runtime.monitor.cells import excerpt

    number = f"In [{result.execution_count}]" if result.execution_count else "a cell"
    source = excerpt(result.info.raw_cell or "") if result.info is not None else ""
    return f"cell {number} ({source})" if source else f"cell {number}"


def _shell() -> InteractiveShell | None:
    """The running IPython shell, without importing IPython where it is not loaded."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None
