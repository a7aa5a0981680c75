"""One line for a storage error on a file or folder a magic's option names: what went wrong,
in words, and what to do, naming the option."""

from __future__ import annotations

import errno

from ipycloud.runtime.messages import one_line

# errno: (what went wrong, what to do); "one" is the file or folder, "<option>" follows.
_CAUSES = {
    errno.EROFS: ("read-only file system", "give one on a writable disk"),
    errno.EACCES: ("permission denied", "give one you may write to"),
    errno.EPERM: ("operation not permitted", "give one you may write to"),
    errno.ENAMETOOLONG: ("a name in its path is too long for its file system",
                         "give a shorter one"),
    errno.ENOSPC: ("no space left on its disk", "free some space there or give another"),
    errno.EDQUOT: ("its disk quota is used up", "free some space there or give another"),
    errno.ENOTCONN: ("transport endpoint is not connected: its mount was lost (as Drive's is "
                     "after a disconnection)", "remount it (%mount_storage drive --force) or "
                                               "give another"),
    errno.EIO: ("input/output error: its disk or connection failed",
                "try again or give another"),
    errno.ENOTDIR: ("a part of its path is a file, not a folder", "give another"),
    errno.EISDIR: ("it is a folder", "give a file's name"),
    errno.ELOOP: ("too many symbolic links in its path", "give another"),
}
_ANOTHER = (None, "give another")  # for an error of another number


def storage_problem(place: str, error: OSError, option: str) -> str:
    """``cannot use <place>: <what went wrong>; <what to do> with <option>``; an error that
    carries no error number (the runtime's own words) keeps its words."""
    if error.errno is None:
        return f"{one_line(error)}; give another with {option}"
    cause, remedy = _CAUSES.get(error.errno, _ANOTHER)
    if cause is None:
        cause = error.strerror.lower() if error.strerror else one_line(error)
    return f"cannot use {place}: {cause}; {remedy} with {option}"


def storage_remedy(error: BaseException, option: str) -> str | None:
    """What to do about the storage error under ``error`` (its cause, or the cause's...),
    naming ``option``; None when no storage error caused it."""
    cause = error.__cause__
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
    if cause is None or cause.errno is None:
        return None
    _, remedy = _CAUSES.get(cause.errno, _ANOTHER)
    return f"{remedy} with {option}"
