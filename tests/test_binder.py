"""The Binder environment (binder/), checked without Docker.

repo2docker's own plan for this repository (``jupyter-repo2docker --no-build``: the
Dockerfile it would build) picks the Python buildpack on Python 3.11, installs
binder/requirements.txt, then runs binder/postBuild, and has no start script (the badge's
``urlpath`` opens the tutorial). The same steps then run in a fresh virtual environment, in
a copy of the repository as a fresh clone has it: no built lab extension, so postBuild
builds it with node, as repo2docker's base environment has node. Jupyter there lists the lab
and server extensions as enabled and OK, every tutorial runs from top to bottom, and the
tutorials' install cell installs ipycloud where it is missing.

Slow (JupyterLab and torch installed, the lab extension built, every tutorial run): select
it with ``-m binder``, leave it out with ``-m "not binder"``. repo2docker lives in a virtual
environment of its own, made on first use: ``~/.cache/ipycloud/repo2docker-venv``
(``IPYCLOUD_REPO2DOCKER_VENV``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from environments import assert_extensions_enabled, isolated_env, run
from tutorials import EXPECTED_OUTPUT, NOTEBOOKS, code_cells, problems

import ipycloud

pytestmark = [pytest.mark.binder, pytest.mark.timeout(1800)]

ROOT = Path(__file__).parent.parent
REPO2DOCKER = "jupyter-repo2docker==2026.4.0"
REPO2DOCKER_VENV = Path(os.environ.get("IPYCLOUD_REPO2DOCKER_VENV",
                                       Path.home() / ".cache" / "ipycloud" / "repo2docker-venv"))
BUILT_LAB_EXTENSION = "ipycloud/labextension/static/style.js"  # node's output, ignored by git
# The buildpack repo2docker picks in a folder: its own detection, in the order it tries them.
PICKED_BUILDPACK = """from repo2docker.app import Repo2Docker
app = Repo2Docker()
print(next(pack.__name__ for pack in app.buildpacks if pack(app.base_image).detect()))"""


@dataclass(frozen=True)
class BinderEnv:
    """The virtual environment built as Binder builds its image, and the copy it was built in."""

    bin_dir: Path
    env: dict[str, str]
    repo: Path


@pytest.fixture(scope="module")
def repo2docker() -> Path:
    """repo2docker's virtual environment (made on first use, brought up to date on each)."""
    if not (REPO2DOCKER_VENV / "bin" / "python").exists():
        REPO2DOCKER_VENV.parent.mkdir(parents=True, exist_ok=True)
        venv.create(REPO2DOCKER_VENV, with_pip=True)
    run([REPO2DOCKER_VENV / "bin" / "python", "-m", "pip", "install", "--quiet", REPO2DOCKER],
        timeout=600)
    return REPO2DOCKER_VENV / "bin"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository as a fresh clone of it has it: the files git tracks or would track,
    nothing it ignores (no virtual environment, no built lab extension)."""
    target = tmp_path_factory.mktemp("binder") / "repo"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                 cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not a tracked file deleted in the working tree
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


@pytest.fixture(scope="module")
def binder(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> BinderEnv:
    """binder/requirements.txt installed into a fresh virtual environment, then
    binder/postBuild run in the clone with node on PATH, as repo2docker's image has it."""
    base = tmp_path_factory.mktemp("binder-env")
    venv.create(base / "venv", with_pip=True)
    bin_dir = base / "venv" / "bin"
    node = shutil.which("node")
    assert node is not None, "the Binder test needs node 20 (repo2docker's image has it)"
    env = isolated_env(bin_dir, base / "jupyter", str(Path(node).parent), "/usr/bin", "/bin")
    # A machine that cannot reach PyTorch's index (binder/requirements.txt names it) has the
    # same wheel in its own index: pip should give up on the unreachable one at once, not
    # retry it for every package it resolves.
    env["PIP_RETRIES"] = "0"
    run([bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-compile",
         "-r", "binder/requirements.txt"], cwd=clone, env=env, timeout=1200)
    assert not (clone / BUILT_LAB_EXTENSION).exists()  # postBuild has it to build
    run([clone / "binder" / "postBuild"], cwd=clone, env=env, timeout=1200)
    return BinderEnv(bin_dir, env, clone)


def test_repo2docker_plans_the_python_buildpack_requirements_then_postbuild(
        repo2docker: Path, clone: Path) -> None:
    assert run([repo2docker / "python", "-c", PICKED_BUILDPACK], cwd=clone) == \
        "PythonBuildPack\n"
    plan = run([repo2docker / "jupyter-repo2docker", "--no-build", "--debug", clone],
               cwd=clone, timeout=300)
    steps = [line for line in plan.splitlines() if line.startswith("RUN ")]
    install = ('RUN ${KERNEL_PYTHON_PREFIX}/bin/pip install --no-cache-dir '
               '-r "binder/requirements.txt"')
    assert install in steps, plan
    assert "RUN ./binder/postBuild" in steps, plan
    assert steps.index(install) < steps.index("RUN ./binder/postBuild"), plan
    assert "Building conda environment for python=3.11" in plan, plan  # binder/runtime.txt
    assert "R2D_ENTRYPOINT" not in plan, plan  # no binder/start


def test_postbuild_builds_the_lab_extension_and_jupyter_lists_both_enabled(
        binder: BinderEnv, tmp_path: Path) -> None:
    assert (binder.repo / BUILT_LAB_EXTENSION).exists()
    assert_extensions_enabled(binder.bin_dir, binder.env, tmp_path)


def test_every_tutorial_runs_in_the_binder_environment(binder: BinderEnv,
                                                       tmp_path: Path) -> None:
    executed = tmp_path / "executed"
    for folder in ("home", "tmp"):
        (tmp_path / folder).mkdir()
    env = {**binder.env, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}
    run([binder.bin_dir / "python", binder.repo / "scripts" / "run_notebooks.py",
         "--into", executed], cwd=tmp_path, env=env, timeout=1500)
    assert sorted(path.name for path in executed.glob("*.ipynb")) == sorted(EXPECTED_OUTPUT)
    for path in sorted(executed.glob("*.ipynb")):
        assert problems(path.name, nbformat.read(path, as_version=4)) == []


def test_the_install_cell_installs_ipycloud_where_it_is_missing(binder: BinderEnv,
                                                                tmp_path: Path) -> None:
    python = binder.bin_dir / "python"
    # The package index here is ipycloud's own wheel, built from the clone.
    wheels = tmp_path / "wheels"
    run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", wheels,
         binder.repo], env=binder.env, cwd=tmp_path, timeout=600)
    run([python, "-m", "pip", "uninstall", "--yes", "ipycloud"], env=binder.env, cwd=tmp_path)
    missing = subprocess.run([python, "-c", "import ipycloud"], env=binder.env, cwd=tmp_path,
                             capture_output=True, check=False)
    assert missing.returncode != 0

    install_cell = code_cells(nbformat.read(NOTEBOOKS[0], as_version=4))[0].source
    find_links = f"{wheels} {binder.env.get('PIP_FIND_LINKS', '')}".strip()
    printed = run([python, "-c", install_cell], cwd=tmp_path, timeout=600,
                  env={**binder.env, "PIP_FIND_LINKS": find_links})
    assert printed.splitlines()[-1] == f"ipycloud {ipycloud.__version__}", printed
    location = run([python, "-c", "import ipycloud; print(ipycloud.__file__)"],
                   env=binder.env, cwd=tmp_path)
    assert Path(location.strip()).is_relative_to(binder.bin_dir.parent), location
