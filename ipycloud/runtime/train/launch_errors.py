"""How a failed launch is told: LaunchError, with the failing rank's traceback chained."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A launch was refused, or a rank failed; ``rank`` and ``exitcode`` say which and how."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None,
                 remote_traceback: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback


class RemoteTraceback(Exception):
    """A worker's formatted traceback, chained as the cause of its LaunchError."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'
