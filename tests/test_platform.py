"""detect_platform on synthetic environments, with marker files laid out under tmp_path."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipycloud.runtime.machine.platform import Platform, detect_platform

HOME = "/home/tester"


@dataclass(frozen=True)
class Case:
    """One platform as its kernel would see it, and what detection must report."""

    env: dict[str, str]
    key: str
    name: str
    persistent: str | None
    scratch: str
    evidence: str  # one signal the evidence must name
    session_limit: bool = False  # whether a session limit is expected
    idle_timeout: bool = False
    files: tuple[str, ...] = ()  # marker files to create under the fake root
    dirs: tuple[str, ...] = ()  # marker folders to create


CASES = {
    "colab": Case(
        {"COLAB_RELEASE_TAG": "release-colab_20250101-060000_RC00", "HOME": "/root"},
        "colab", "Google Colab", "/content/drive/MyDrive", "/content", "env COLAB_RELEASE_TAG",
        session_limit=True, idle_timeout=True, dirs=("content/sample_data",),
    ),
    "colab-by-folder": Case(
        {"HOME": "/root"}, "colab", "Google Colab", "/content/drive/MyDrive", "/content",
        "dir /content/sample_data", session_limit=True, idle_timeout=True,
        dirs=("content/sample_data",),
    ),
    "kaggle": Case(
        {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com"},
        "kaggle", "Kaggle", "/kaggle/working", "/tmp", "env KAGGLE_KERNEL_RUN_TYPE",
        session_limit=True, idle_timeout=True,
    ),
    "kaggle-by-folder": Case(
        {}, "kaggle", "Kaggle", "/kaggle/working", "/tmp", "dir /kaggle/working",
        session_limit=True, idle_timeout=True, dirs=("kaggle/working",),
    ),
    "paperspace": Case(
        {"PAPERSPACE_NOTEBOOK_REPO_ID": "r1a2b3c", "PAPERSPACE_CLUSTER_ID": "clg07azjl"},
        "paperspace", "Paperspace Gradient", "/storage", "/tmp",
        "env PAPERSPACE_NOTEBOOK_REPO_ID", session_limit=True,
    ),
    "studiolab": Case(
        {"HOME": "/home/studio-lab-user"}, "studiolab", "SageMaker Studio Lab",
        "/home/studio-lab-user", "/tmp", "env HOME=/home/studio-lab-user", session_limit=True,
    ),
    "sagemaker": Case(
        {}, "sagemaker", "SageMaker notebook instance", "/home/ec2-user/SageMaker", "/tmp",
        "file /opt/ml/metadata/resource-metadata.json",
        files=("opt/ml/metadata/resource-metadata.json",),
    ),
    "vertex": Case(
        {"DL_ANACONDA_HOME": "/opt/conda"}, "vertex", "Vertex AI Workbench", "/home/jupyter",
        "/tmp", "file /opt/deeplearning/metadata/env_version",
        files=("opt/deeplearning/metadata/env_version",),
    ),
    "azureml": Case(
        {"CI_RESOURCE_GROUP": "rg-ml", "CI_WORKSPACE": "ws-ml"}, "azureml",
        "Azure ML compute instance", f"{HOME}/cloudfiles/code", "/tmp", "env CI_WORKSPACE",
    ),
    "binder": Case(
        {"BINDER_REPO_URL": "https://github.com/org/repo",
         "BINDER_LAUNCH_HOST": "https://mybinder.org/"},
        "binder", "Binder", None, "/tmp", "env BINDER_REPO_URL",
        session_limit=True, idle_timeout=True,
    ),
    "jupyterhub": Case(
        {"JUPYTERHUB_USER": "tester", "JUPYTERHUB_SERVICE_PREFIX": "/user/tester/"},
        "jupyterhub", "JupyterHub", HOME, "/tmp", "env JUPYTERHUB_USER",
    ),
}


def make_root(root: Path, case: Case) -> None:
    """Create the case's marker files and folders under ``root``."""
    for folder in case.dirs:
        (root / folder).mkdir(parents=True)
    for marker in case.files:
        (root / marker).parent.mkdir(parents=True, exist_ok=True)
        (root / marker).write_text("{}\n")


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_platform(tmp_path: Path, case: Case) -> None:
    make_root(tmp_path, case)
    platform = detect_platform({"HOME": HOME, **case.env}, root=tmp_path)
    assert platform.key == case.key
    assert platform.name == case.name
    assert platform.persistent_dir == (Path(case.persistent) if case.persistent else None)
    assert platform.scratch_dir == Path(case.scratch)
    assert (platform.session_limit_s is not None) == case.session_limit
    assert (platform.idle_timeout_s is not None) == case.idle_timeout
    assert case.evidence in platform.evidence


def test_limits_are_positive_and_idle_is_shorter_than_the_session(tmp_path: Path) -> None:
    for label, case in CASES.items():
        root = tmp_path / label
        root.mkdir()
        make_root(root, case)
        platform = detect_platform({"HOME": HOME, **case.env}, root=root)
        assert platform.key == case.key
        if platform.session_limit_s is not None:
            assert platform.session_limit_s > 0
        if platform.idle_timeout_s is not None:
            assert platform.session_limit_s is not None
            assert 0 < platform.idle_timeout_s < platform.session_limit_s


def test_unknown_environment_is_local_with_home_from_env(tmp_path: Path) -> None:
    platform = detect_platform({"HOME": "/home/alice", "PATH": "/usr/bin"}, root=tmp_path)
    assert platform.key == "local"
    assert platform.name == "Local machine"
    assert platform.persistent_dir == Path("/home/alice")
    assert platform.scratch_dir == Path(tempfile.gettempdir())
    assert platform.session_limit_s is None
    assert platform.idle_timeout_s is None
    assert platform.evidence == ()


def test_binder_wins_over_the_jupyterhub_variables_it_also_sets(tmp_path: Path) -> None:
    env = {**CASES["binder"].env, **CASES["jupyterhub"].env}
    platform = detect_platform(env, root=tmp_path)
    assert platform.key == "binder"
    assert not any("JUPYTERHUB" in signal for signal in platform.evidence)


def test_colab_env_on_a_kaggle_root_is_colab(tmp_path: Path) -> None:
    (tmp_path / "kaggle/working").mkdir(parents=True)
    platform = detect_platform({"COLAB_GPU": "1"}, root=tmp_path)
    assert platform.key == "colab"
    assert platform.evidence == ("env COLAB_GPU",)


def test_empty_variables_are_not_signals(tmp_path: Path) -> None:
    platform = detect_platform({"COLAB_GPU": "", "JUPYTERHUB_USER": ""}, root=tmp_path)
    assert platform.key == "local"


def test_paths_are_real_not_under_root(tmp_path: Path) -> None:
    (tmp_path / "kaggle/working").mkdir(parents=True)
    platform = detect_platform({}, root=tmp_path)
    assert platform.persistent_dir == Path("/kaggle/working")
    assert platform.evidence == ("dir /kaggle/working",)


def test_in_container_with_dockerenv(tmp_path: Path) -> None:
    (tmp_path / ".dockerenv").touch()
    assert detect_platform({}, root=tmp_path).in_container


def test_in_container_with_podman_containerenv(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run/.containerenv").touch()
    assert detect_platform({}, root=tmp_path).in_container


def test_in_container_with_kubepods_cgroup(tmp_path: Path) -> None:
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").write_text("11:memory:/kubepods/burstable/pod1234/abcdef\n")
    assert detect_platform({}, root=tmp_path).in_container


def test_in_container_with_kubernetes_env(tmp_path: Path) -> None:
    assert detect_platform({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, root=tmp_path).in_container


def test_in_container_with_a_cgroup_memory_limit(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/\n")
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "sys/fs/cgroup/memory.max").write_text("4294967296\n")
    assert detect_platform({}, root=tmp_path).in_container


def test_not_in_container_on_an_empty_root(tmp_path: Path) -> None:
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").write_text("0::/init.scope\n")
    assert not detect_platform({}, root=tmp_path).in_container


def test_folder_where_a_marker_file_is_expected_does_not_match(tmp_path: Path) -> None:
    (tmp_path / "opt/ml/metadata/resource-metadata.json").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").mkdir(parents=True)
    platform = detect_platform({"HOME": HOME}, root=tmp_path)
    assert platform.key == "local"
    assert not platform.in_container


def test_binary_junk_and_link_loops_do_not_raise(tmp_path: Path) -> None:
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").write_bytes(b"\x00\xff\xfe\x80 junk")
    (tmp_path / "opt/deeplearning/metadata").mkdir(parents=True)
    loop = tmp_path / "opt/deeplearning/metadata/env_version"
    os.symlink(loop, loop)
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cgroup.controllers").write_bytes(b"\xff")
    (tmp_path / "sys/fs/cgroup/memory.max").write_bytes(b"\x00\x01garbage")
    platform = detect_platform({"HOME": HOME}, root=tmp_path)
    assert platform.key == "local"
    assert not platform.in_container


def test_to_dict_is_json_serialisable(tmp_path: Path) -> None:
    colab = detect_platform({"COLAB_RELEASE_TAG": "x"}, root=tmp_path).to_dict()
    binder = detect_platform(CASES["binder"].env, root=tmp_path).to_dict()
    colab_back = json.loads(json.dumps(colab))
    binder_back = json.loads(json.dumps(binder))
    assert colab_back["persistent_dir"] == "/content/drive/MyDrive"
    assert colab_back["scratch_dir"] == "/content"
    assert colab_back["evidence"] == ["env COLAB_RELEASE_TAG"]
    assert colab_back["in_container"] is False
    assert binder_back["persistent_dir"] is None
    assert set(colab_back) == {
        "key", "name", "persistent_dir", "scratch_dir", "session_limit_s", "idle_timeout_s",
        "in_container", "evidence",
    }


def test_real_machine_does_not_raise() -> None:
    platform = detect_platform()
    assert isinstance(platform, Platform)
    assert platform.scratch_dir.is_absolute()
    json.dumps(platform.to_dict())
