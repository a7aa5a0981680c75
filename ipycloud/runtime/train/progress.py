"""Progress of a training run: a tqdm.auto bar (a widget in notebooks, text in terminals).

Without ipywidgets the bar is tqdm's text one everywhere: tqdm.auto would warn
("IProgress not found") on every run in a notebook before falling back to it.
"""

from __future__ import annotations

from typing import Any

from ipycloud.runtime._optional import is_available


class Progress:
    """A progress bar over optimizer steps, or silence when ``enabled`` is False."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None

    def start(self, total: int | None, initial: int) -> None:
        """Show the bar, ``initial`` of ``total`` steps already done."""
        if self.enabled:
            self._bar = _bar_class()(total=total, initial=initial, unit="step",
                                     dynamic_ncols=True)

    def say(self, line: str) -> None:
        """A line of text, above the bar once it is shown."""
        if not self.enabled:
            return
        if self._bar is None:
            print(line, flush=True)
        else:
            self._bar.write(line)

    def advance(self, steps: int, **postfix: Any) -> None:
        if self._bar is None:
            return
        if postfix:
            self._bar.set_postfix({key: _short(value) for key, value in postfix.items()},
                                  refresh=False)
        self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _short(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


def _bar_class() -> Any:
    """tqdm.auto's bar where ipywidgets can draw it, tqdm's text bar otherwise."""
    if is_available("ipywidgets"):
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm
