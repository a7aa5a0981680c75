"""Live views that leave a still behind: each is displayed with a display id, and when the
view stops every output it was displayed in is replaced by a Snapshot of the dashboard, so
a notebook saved afterwards shows the snapshot instead of a dead frame or a widget whose
model is gone ("Error displaying widget: model not found")."""

from __future__ import annotations

from typing import Any

from IPython.display import DisplayHandle, display

from ipycloud.runtime.monitor.dashboard_still import Snapshot
from ipycloud.runtime.monitor.sampler import Sampler


class Stills:
    """The outputs a live view was displayed in."""

    def __init__(self) -> None:
        self._handles: list[DisplayHandle] = []

    def show(self, bundle: dict[str, Any]) -> None:
        """Display the live view's ``bundle`` in an output that a still can replace."""
        handle = display(bundle, raw=True, display_id=True)
        if handle is not None:
            self._handles.append(handle)

    def freeze(self, sampler: Sampler, note: str) -> Snapshot | None:
        """Replace each output of the view by the dashboard's snapshot now, saying ``note``;
        the snapshot, or None where the view was never displayed."""
        if not self._handles:
            return None
        snapshot = Snapshot(sampler.latest() or sampler.sample_now(), note)
        bundle = snapshot._repr_mimebundle_()
        for handle in self._handles:
            handle.update(bundle, raw=True)
        self._handles.clear()
        return snapshot
