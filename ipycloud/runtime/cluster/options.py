"""The choices of an export, checked before anything is written: nodes, accelerators,
buckets, data mounts, restarts, the task's name.

The bucket schemes are those SkyPilot 0.14.1 mounts (``sky.data.storage.StoreType``);
``cos://`` and ``oci://`` hold data, not checkpoints: SkyPilot 0.14.1 has no MOUNT_CACHED
for IBM COS, nor for OCI unless it is reached through its S3 API.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import SplitResult, urlsplit

from ipycloud.runtime.messages import ParameterError

# Where the checkpoint bucket is mounted on every node.
CHECKPOINT_MOUNT = "/ipycloud/checkpoints"

AZURE_BLOB_HOST = ".blob.core.windows.net"
CHECKPOINT_SCHEMES = ("s3", "gs", "r2", "https", "nebius", "cw", "vastdata", "hf")
DATA_SCHEMES = (*CHECKPOINT_SCHEMES, "cos", "oci")
_SPELLED = {"https": f"https://<account>{AZURE_BLOB_HOST}/<container>",
            "cos": "cos://<region>/<bucket>",
            "hf": "hf://buckets/<namespace>/<name>"}

_USES = {"bucket": (CHECKPOINT_SCHEMES, "checkpoints"), "data": (DATA_SCHEMES, "data")}

# SkyPilot's rule for task names.
_NAME = re.compile(r"[a-zA-Z0-9]+(?:[._-]{1,2}[a-zA-Z0-9]+)*")
_ACCELERATOR = re.compile(r"([A-Za-z][A-Za-z0-9._-]*)(?::(\d+))?")


class ExportError(ParameterError):
    """An export refused before anything was written: one line that says what to change."""


@dataclass(frozen=True)
class Accelerators:
    """The accelerators of each node, as SkyPilot names them (``A100:8``)."""

    name: str
    count: int

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


@dataclass(frozen=True)
class Mount:
    """What each node finds at ``path``: a bucket (a URL) or a folder uploaded from here."""

    path: str
    source: str
    is_bucket: bool


def check_nodes(nodes: int) -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ExportError("{nodes} must be a whole number of nodes, at least 1, not {value}",
                          nodes="nodes", value=repr(nodes))
    return nodes


def check_max_restarts(max_restarts: int) -> int:
    if (isinstance(max_restarts, bool) or not isinstance(max_restarts, int)
            or max_restarts < 0):
        raise ExportError("{max_restarts} must be a whole number, 0 or more, not {value}",
                          max_restarts="max_restarts", value=repr(max_restarts))
    return max_restarts


def parse_accelerators(text: str | None) -> Accelerators | None:
    """``"A100:8"`` (8 per node), ``"A100"`` (1), or None for CPU nodes."""
    if text is None:
        return None
    found = _ACCELERATOR.fullmatch(text.strip()) if isinstance(text, str) else None
    count = int(found.group(2) or 1) if found else 0
    if found is None or count < 1:
        raise ExportError("{accelerators} must name an accelerator and how many each node "
                          "has, like 'A100:8' or 'H100', not {value}",
                          accelerators="accelerators", value=repr(text))
    return Accelerators(found.group(1), count)


def check_bucket(url: str) -> str:
    """The checkpoint bucket's URL, refused unless SkyPilot can mount it for writing."""
    return _bucket_url(url, "bucket")


def parse_data(data: dict[str, str | os.PathLike[str]] | None) -> list[Mount]:
    """``{"/data": "s3://my-data", "/extra": "./local-folder"}`` as mounts: a URL is a
    bucket, anything else a file or folder here that is uploaded to every node. Each path
    is normalised (``/./data/`` is ``/data``); one path given twice is refused."""
    mounts: dict[str, Mount] = {}
    given: dict[str, str] = {}
    for written, source in (data or {}).items():
        path = _mount_path(written)
        if path in given:
            raise ExportError("{data}: {first} and {second} are the mount path {path} given "
                              "twice: give it once", data="data", first=repr(given[path]),
                              second=repr(written), path=path)
        given[path] = written
        text = os.fspath(source)
        if "://" in text:
            mounts[path] = Mount(path, _bucket_url(text, "data"), is_bucket=True)
        else:
            mounts[path] = Mount(path, _local_source(text, path), is_bucket=False)
    return list(mounts.values())


def check_utf8(text: str, parameter: str) -> str:
    """``text``, refused (ExportError) unless it can be written as UTF-8, as a task file is
    (a name read from a file system in another encoding holds surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ExportError(f"{{{parameter}}}: {{value}} is not UTF-8 text, which a task file "
                          "must be: rename it", value=repr(text),
                          **{parameter: parameter}) from None
    return text


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ExportError("{name} must be letters and digits joined by '.', '_' or '-' (as "
                          "SkyPilot names tasks), not {value}", name="name", value=repr(name))
    return name


def name_from(text: str) -> str:
    """A task name made of ``text`` (a function's or a script's name)."""
    return "-".join(re.findall(r"[a-zA-Z0-9]+", text)) or "ipycloud-train"


def _bucket_url(url: str, parameter: str) -> str:
    """``url`` if it names a bucket that SkyPilot mounts for ``parameter`` (``bucket``: the
    checkpoints, ``data``)."""
    schemes, purpose = _USES[parameter]
    if isinstance(url, str):
        check_utf8(url, parameter)
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in schemes or not _names_a_bucket(parts):
        spelled = ", ".join(_SPELLED.get(scheme, f"{scheme}://") for scheme in schemes)
        raise ExportError(f"{{{parameter}}}: {{value}} is not a bucket SkyPilot mounts for "
                          f"{purpose}: give one of {{spelled}}", value=repr(url),
                          spelled=spelled, **{parameter: parameter})
    return url


def _names_a_bucket(parts: SplitResult) -> bool:
    """Whether the URL holds a bucket's name where SkyPilot reads it."""
    segments = [segment for segment in parts.path.split("/") if segment]
    if parts.scheme == "https":
        return parts.netloc.endswith(AZURE_BLOB_HOST) and bool(segments)
    if parts.scheme == "hf":
        return parts.netloc == "buckets" and len(segments) >= 2
    if parts.scheme == "cos":
        return bool(parts.netloc) and bool(segments)
    return bool(parts.netloc)


def _mount_path(path: str) -> str:
    """``path`` normalised (``//data/./x/`` is ``/data/x``), refused unless absolute on the
    nodes, without ``..``, and apart from the checkpoint bucket's mount."""
    written = PurePosixPath(path) if isinstance(path, str) else None
    if written is None or not (path.startswith(("/", "~/")) and ".." not in written.parts):
        raise ExportError("{data}: a mount path must be absolute on the nodes, like "
                          "'/data' or '~/data', not {value}", data="data", value=repr(path))
    check_utf8(path, "data")
    normal = posixpath.normpath(path)
    if normal.startswith("//"):  # POSIX leaves two leading slashes to the system: Linux
        normal = "/" + normal.lstrip("/")  # reads them as one
    posix = PurePosixPath(normal)
    mine = PurePosixPath(CHECKPOINT_MOUNT)
    if posix == mine or mine in posix.parents or posix in mine.parents:
        raise ExportError("{data}: {value} overlaps the checkpoint bucket's mount at {mount}",
                          data="data", value=repr(path), mount=CHECKPOINT_MOUNT)
    return normal


def _local_source(text: str, path: str) -> str:
    local = Path(text).expanduser().absolute()
    check_utf8(str(local), "data")
    if not local.exists():
        raise ExportError("{data}: {value} (for {path}) is neither a bucket URL nor a file "
                          "or folder here", data="data", value=repr(text), path=path)
    return str(local)
