"""``mount()`` on every platform, through synthetic environments and a Colab stub."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipycloud.runtime.machine.platform import Platform, detect_platform
from ipycloud.runtime.messages import in_words
from ipycloud.runtime.storage.mount import (
    PROJECT_FOLDERS,
    MountError,
    StorageWarning,
    mount,
)


@pytest.fixture
def colab_drive(colab_stub: None) -> Iterator[Any]:
    """The google.colab stub, importable and reset for each test."""
    from google.colab import drive

    drive.BEHAVIOUR = "ok"
    drive.calls.clear()
    yield drive


def platform_for(env: dict[str, str], tmp_path: Path, **paths: Path) -> Platform:
    """A detected platform whose folders are moved under tmp_path."""
    detected = detect_platform({"HOME": str(tmp_path / "home"), **env}, tmp_path)
    return dataclasses.replace(detected, **paths)


def colab(tmp_path: Path) -> Platform:
    return platform_for({"COLAB_RELEASE_TAG": "release"}, tmp_path,
                        persistent_dir=tmp_path / "content/drive/MyDrive")


def test_colab_mounts_drive_and_makes_the_project(colab_drive: Any, tmp_path: Path) -> None:
    result = mount(project="exp1", platform=colab(tmp_path), timeout_s=30)
    assert result.kind == "drive" and result.persistent
    assert result.project == tmp_path / "content/drive/MyDrive/exp1"
    assert sorted(p.name for p in result.project.iterdir()) == sorted(PROJECT_FOLDERS)
    assert colab_drive.calls == [{"mountpoint": str(tmp_path / "content/drive"),
                                  "force_remount": False, "timeout_ms": 30000,
                                  "readonly": False}]
    mount(project="exp1", platform=colab(tmp_path))
    assert len(colab_drive.calls) == 1  # a healthy mount is reused


@pytest.mark.parametrize(("behaviour", "reason"), [("timeout", "Timed out waiting"),
                                                   ("refused", "mount failed")])
def test_a_failed_mount_says_why_and_what_to_do(colab_drive: Any, tmp_path: Path,
                                                behaviour: str, reason: str) -> None:
    colab_drive.BEHAVIOUR = behaviour
    with pytest.raises(MountError) as caught:
        mount(platform=colab(tmp_path))
    message = str(caught.value)
    assert reason in message and "accept the authorisation" in message
    assert "\n" not in message
    assert message.endswith(", or use force=True")
    assert in_words(caught.value, {"force": "--force"}) == message.replace("force=True",
                                                                          "--force")


def test_a_stale_mount_is_refused_then_mended_with_force(colab_drive: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    platform = colab(tmp_path)
    mount(platform=platform)
    stale = {"on": True}
    real_listdir = os.listdir

    def listdir(path: Any) -> list[str]:  # what a FUSE mount that lost its daemon answers
        if stale["on"] and Path(path) == platform.persistent_dir:
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
        return real_listdir(path)

    monkeypatch.setattr("ipycloud.runtime.storage.mount.os.listdir", listdir)
    with pytest.raises(MountError, match=r"is stale .* mount again with force=True$") as caught:
        mount(platform=platform)
    assert in_words(caught.value, {"force": "--force"}).endswith(" mount again with --force")
    original_mount = colab_drive.mount

    def remount(*args: Any, **kwargs: Any) -> None:
        original_mount(*args, **kwargs)
        stale["on"] = False

    monkeypatch.setattr(colab_drive, "mount", remount)
    result = mount(platform=platform, force=True)
    assert colab_drive.calls[-1]["force_remount"] is True
    assert (result.project / "data").is_dir()


def test_drive_outside_colab_is_a_clear_error(tmp_path: Path) -> None:
    local = platform_for({}, tmp_path)
    with pytest.raises(MountError, match="drive storage is not available on Local machine"):
        mount("drive", platform=local)


def test_kaggle_uses_working_and_lists_inputs(tmp_path: Path) -> None:
    working = tmp_path / "kaggle/working"
    (tmp_path / "kaggle/input/titanic").mkdir(parents=True)
    (tmp_path / "kaggle/input/titanic/train.csv").write_bytes(b"x" * 1000)
    kaggle = platform_for({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, tmp_path,
                          persistent_dir=working)
    result = mount(project="exp", platform=kaggle)
    assert result.project == working / "exp" and result.kind == "kaggle"
    assert result.inputs == (("titanic", 1000),)
    assert "inputs: titanic (1000 B)" in str(result)


@pytest.mark.parametrize(("env", "persistent", "expected"), [
    ({}, None, "home/ipycloud/default"),  # local: HOME comes from the environment
    ({"PAPERSPACE_CLUSTER_ID": "c1"}, "storage", "storage/ipycloud/default"),
])
def test_other_platforms_use_ipycloud_in_their_persistent_folder(
        tmp_path: Path, env: dict[str, str], persistent: str | None, expected: str) -> None:
    moved = {"persistent_dir": tmp_path / persistent} if persistent else {}
    result = mount(platform=platform_for(env, tmp_path, **moved))
    assert result.project == tmp_path / expected
    assert result.persistent and (result.project / "checkpoints").is_dir()


def test_a_given_root_wins(tmp_path: Path) -> None:
    result = mount(project="p", root=tmp_path / "mine", platform=platform_for({}, tmp_path))
    assert result.project == tmp_path / "mine/p"


def test_binder_warns_that_nothing_persists(tmp_path: Path) -> None:
    binder = platform_for({"BINDER_SERVICE_HOST": "x"}, tmp_path, scratch_dir=tmp_path / "tmp")
    with pytest.warns(StorageWarning, match="nothing persists on Binder"):
        result = mount(platform=binder)
    assert not result.persistent and result.project == tmp_path / "tmp/ipycloud/default"
    assert "LOST when the session ends" in str(result)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"kind": "s3"}, ValueError, "unknown storage kind 's3'"),
    ({"project": "../up"}, ValueError, "invalid project name '../up'"),
    ({"project": ""}, ValueError, "invalid project name ''"),
])
def test_bad_input(tmp_path: Path, kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        mount(platform=platform_for({}, tmp_path), **kwargs)


def test_an_unwritable_place_is_a_mount_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(MountError, match="cannot create the project folder"):
        mount(root=blocker, platform=platform_for({}, tmp_path))
