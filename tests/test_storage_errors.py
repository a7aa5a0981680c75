"""Every storage operation that fails raises one kind of error a script can catch,
``ipycloud.StorageError``, with a one-line message; each keeps its own class too."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kaggle_server import closed_port

import ipycloud
from ipycloud.runtime.machine.platform import detect_platform

DRIVE_ID = "1AbCdEfGhIjKlMnOpQrStUvWxYz012345"


def unsafe_archive(folder: Path) -> Path:
    archive = folder / "escape.tar"
    with tarfile.open(archive, "w") as tar:
        member = tarfile.TarInfo("../outside.txt")
        member.size = 1
        tar.addfile(member, io.BytesIO(b"x"))
    return archive


FAILURES: dict[str, Callable[[Path], Any]] = {
    "MountError": lambda folder: ipycloud.mount(
        "drive", platform=detect_platform(environ={"HOME": str(folder)}, root=folder)),
    "DownloadError": lambda folder: ipycloud.download(
        f"http://127.0.0.1:{closed_port()}/data.bin", folder / "data.bin", retries=0,
        progress=False),
    "KaggleError": lambda folder: ipycloud.kaggle_download("alice/iris", folder / "iris",
                                                           progress=False),
    "GdriveError": lambda folder: ipycloud.gdrive_download(DRIVE_ID, folder / "drive",
                                                           progress=False),
    "UnsafeArchiveError": lambda folder: ipycloud.extract(unsafe_archive(folder),
                                                          folder / "out", strict=True,
                                                          progress=False),
}


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_each_failed_storage_operation_is_a_storage_error(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed_port()}")  # no network reached

    with pytest.raises(ipycloud.StorageError) as caught:
        FAILURES[kind](tmp_path)

    assert type(caught.value).__name__ == kind
    assert str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path.parent / "outside.txt").exists()
