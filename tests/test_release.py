"""The release as PyPI gets it, and what keeps it consistent.

``python -m build`` makes the sdist and then, from the unpacked sdist, the wheel, as the
release workflow does. Both carry the built lab extension, the dashboard page a kernel
serves, the price table and the license, and nothing of the development tree; twine and
pydistcheck (its settings under ``[tool.pydistcheck]`` in pyproject.toml) accept them; and
the wheel, installed into a fresh virtual environment on a PATH without node, passes the
fast tests (FAST_TESTS) against the installed copy.

Those are slow (a build and a fresh environment): select them with ``-m release``, leave
them out with ``-m "not release"``. The checks of the version and of the workflows under
.github/workflows are quick and unmarked.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import pytest
import yaml
from test_wheel import LABEXTENSION, run
from test_wheel import (
    test_the_wheel_carries_the_built_extension_and_the_server_config as check_wheel_extension,
)

import ipycloud

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).parent.parent
VERSION = ipycloud.__version__
WORKFLOWS = ROOT / ".github" / "workflows"
REPOSITORY = "https://github.com/ipycloud/ipycloud"

# Tests that need nothing beyond ipycloud's core dependencies, pytest and pytest-timeout: no
# torch, browser, kernel, Jupyter server or XLA. They run against the installed wheel, less
# the few of them that need an extra.
FAST_TESTS = (
    "test_cgroup.py", "test_cli.py", "test_download.py", "test_extract.py",
    "test_filesystem.py", "test_hardware.py", "test_imports.py", "test_magics.py",
    "test_mount.py", "test_nvml.py", "test_platform.py", "test_report.py", "test_reprs.py",
    "test_sampler.py", "test_sync.py", "test_usage.py", "test_usage_recording.py",
)
NEEDS_AN_EXTRA = (
    "test_cli.py::test_console_script_runs_demo",  # the demo trains: torch
    "test_cli.py::test_checkpoint_list_of_a_missing_folder_exits_1_with_one_line",  # torch
    "test_cli.py::test_ctrl_c_ends_a_command_with_one_line",  # the demo trains: torch
    "test_imports.py::test_the_server_measurement_sees_jupyter_server",
)
# What a machine without node lacks; the fresh environment's PATH has none of them.
NODE_COMMANDS = frozenset({"node", "nodejs", "npm", "npx", "corepack", "yarn", "jlpm"})
# Parts of the development tree that no distribution carries.
DEVELOPMENT_FOLDERS = frozenset({
    "node_modules", ".venv", "test-artifacts", "__pycache__", ".pytest_cache", ".mypy_cache",
    ".ruff_cache", ".ipynb_checkpoints", ".yarn", ".git", ".github", ".ci", "dist", "build",
})
# The documentation site is built from the repository (tests/test_docs.py), never shipped.
DEVELOPMENT_PREFIXES = ("benchmarks/results/", "labextension/lib/", "docs/", "mkdocs.yml",
                        "tests/test_docs.py", "tests/markdown_examples.py",
                        "tests/run_markdown_page.py")
DEVELOPMENT_SUFFIXES = (".pyc", ".tsbuildinfo")


class Dists(NamedTuple):
    """The two files a release uploads."""

    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """``python -m build`` of this checkout: the sdist, then the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], timeout=900)
    return Dists(sdist=out / f"ipycloud-{VERSION}.tar.gz",
                 wheel=out / f"ipycloud-{VERSION}-py3-none-any.whl")


def sdist_files(sdist: Path) -> dict[str, bytes]:
    """The sdist's files by their path under its top folder."""
    top = f"ipycloud-{VERSION}/"
    files = {}
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            content = archive.extractfile(member)  # None for folders and links
            if content is not None:
                assert member.name.startswith(top), member.name
                files[member.name.removeprefix(top)] = content.read()
    return files


def wheel_files(wheel: Path) -> dict[str, bytes]:
    """The wheel's files by their path in it."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def development_files(names: set[str]) -> list[str]:
    """The names that belong to the development tree rather than to a release."""
    return sorted(name for name in names
                  if DEVELOPMENT_FOLDERS.intersection(PurePosixPath(name).parent.parts)
                  or name.startswith(DEVELOPMENT_PREFIXES)
                  or name.endswith(DEVELOPMENT_SUFFIXES))


def relative_links(markdown: str) -> list[str]:
    """The targets of Markdown links and pictures that are relative to the repository."""
    return re.findall(r"\]\(((?!https?://|#)[^)]*)\)", markdown)


def built_extension_version(files: dict[str, bytes], folder: str) -> str:
    """The version in the built lab extension's package.json under ``folder``."""
    return str(json.loads(files[f"{folder}/package.json"])["version"])


@pytest.mark.release
def test_the_sdist_carries_the_built_extension_the_price_table_and_the_license(
        dists: Dists) -> None:
    files = sdist_files(dists.sdist)
    for name in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml",
                 "ipycloud/_version.py", "ipycloud/data/prices.json",
                 "ipycloud/labextension/static/style.js",
                 "ipycloud/labextension/schemas/ipycloud/plugin.json",
                 "ipycloud/monitor_page/index.html",
                 # what the wheel built from the sdist needs, or a rebuild of the extension
                 "labextension/package.json", "labextension/yarn.lock",
                 "labextension/install.json",
                 "jupyter-config/jupyter_server_config.d/ipycloud.json"):
        assert name in files, f"{dists.sdist.name} lacks {name}"
    assert any(re.fullmatch(r"ipycloud/labextension/static/remoteEntry\.[0-9a-f]+\.js", name)
               for name in files), f"{dists.sdist.name} has no built remoteEntry"
    # A build left from an older version would be shipped as it is: it must be this one's.
    assert built_extension_version(files, "ipycloud/labextension") == VERSION
    assert json.loads(files["ipycloud/data/prices.json"]) == json.loads(
        (ROOT / "ipycloud" / "data" / "prices.json").read_bytes())
    assert development_files(set(files)) == []


@pytest.mark.release
def test_the_wheel_built_from_the_sdist_carries_the_same(dists: Dists) -> None:
    check_wheel_extension(dists.wheel)  # the lab extension and the server config
    files = wheel_files(dists.wheel)
    share = f"ipycloud-{VERSION}.data/data/share/jupyter/labextensions/{LABEXTENSION}"
    assert built_extension_version(files, share) == VERSION
    for name in ("ipycloud/data/prices.json", "ipycloud/monitor_page/index.html"):
        assert name in files, f"{dists.wheel.name} lacks {name}"
    assert f"ipycloud-{VERSION}.dist-info/licenses/LICENSE" in files
    # The extension is installed once, as shared data, not a second time inside the package.
    assert not [name for name in files if name.startswith("ipycloud/labextension/")]
    assert not [name for name in files if not name.startswith(("ipycloud/", "ipycloud-"))]
    assert development_files(set(files)) == []

    metadata = email.parser.Parser().parsestr(
        files[f"ipycloud-{VERSION}.dist-info/METADATA"].decode())
    assert (metadata["Name"], metadata["Version"]) == ("ipycloud", VERSION)
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata["Description-Content-Type"] == "text/markdown"
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL", []))
    assert set(urls) >= {"Homepage", "Repository", "Issues", "Changelog"}, urls
    assert all(url.startswith(REPOSITORY) for url in urls.values()), urls
    # PyPI shows the description away from the repository: no picture or link relative to it.
    assert relative_links(str(metadata.get_payload())) == []


@pytest.mark.release
def test_twine_and_pydistcheck_accept_both(dists: Dists) -> None:
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dists)], timeout=120)
    # pydistcheck reads its settings (the size caps) from pyproject.toml in its folder.
    run([str(Path(sys.executable).with_name("pydistcheck")), *map(str, dists)], cwd=ROOT,
        timeout=120)


def path_without_node(folder: Path) -> str:
    """A PATH holding the commands this machine's PATH holds, less node's and this test
    environment's own: links to them in ``folder``, the first of each name as PATH finds it."""
    folder.mkdir()
    own = Path(sys.executable).parent
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not directory or not Path(directory).is_dir() or Path(directory) == own:
            continue
        for command in Path(directory).iterdir():
            link = folder / command.name
            if (command.name not in NODE_COMMANDS and not link.exists()
                    and command.is_file() and os.access(command, os.X_OK)):
                link.symlink_to(command)
    return str(folder)


@pytest.mark.release
def test_the_installed_wheel_passes_the_fast_tests_without_node(dists: Dists,
                                                               tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    env = {**{name: value for name, value in os.environ.items()
              if not name.startswith(("JUPYTER", "VIRTUAL_ENV", "PYTHON"))},
           "PATH": os.pathsep.join([str(env_dir / "bin"), path_without_node(tmp_path / "bin")])}
    for command in NODE_COMMANDS:
        assert shutil.which(command, path=env["PATH"]) is None, command
    # pytest, its timeout plugin, and what conftest.py and the helpers it loads import
    # beyond them (hypothesis: its profile for the property tests).
    runners = [f"{name}=={importlib.metadata.version(name)}"
               for name in ("pytest", "pytest-timeout", "requests", "hypothesis")]
    run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", str(dists.wheel),
         *runners], env=env, cwd=tmp_path, timeout=900)

    # The tests run from a copy outside the checkout, and ipycloud is imported before
    # pytest starts in the same process: every test uses the copy pip installed.
    tests = shutil.copytree(ROOT / "tests", tmp_path / "tests",
                            ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys, ipycloud, pytest; print('ipycloud from', ipycloud.__file__); "
            "sys.exit(pytest.main(sys.argv[1:]))")
    output = run([str(python), "-c", code, "-p", "no:cacheprovider",
                  "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                  *(str(tests / name) for name in FAST_TESTS),
                  *(f"--deselect=tests/{name}" for name in NEEDS_AN_EXTRA)],  # rootdir-relative
                 env=env, cwd=tmp_path, timeout=900)
    origin = re.search(r"^ipycloud from (.+)$", output, re.M)
    assert origin, output
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert Path(origin[1]) == Path(site_packages) / "ipycloud" / "__init__.py", output
    assert re.search(r"^=+ \d+ passed", output, re.M), output


def test_the_package_and_its_lab_extension_have_one_version() -> None:
    """ipycloud/_version.py is the version; the lab extension's package.json repeats it,
    and this keeps the two in step (the built extension reports its own to JupyterLab)."""
    package = json.loads((ROOT / "labextension" / "package.json").read_text())
    assert package["version"] == VERSION


def workflow(name: str) -> dict[str, Any]:
    """A workflow as a mapping; its trigger under "on" (YAML 1.1 reads that key as True)."""
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps_using(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    """The job's steps that use ``action`` (any version of it)."""
    return [step for step in job["steps"] if str(step.get("uses", "")).startswith(f"{action}@")]


def test_the_test_workflow_runs_the_suite_on_every_supported_python() -> None:
    flow = workflow("test.yml")
    assert {"push", "pull_request"} <= set(flow["on"])
    (job,) = flow["jobs"].values()
    assert job["runs-on"].startswith("ubuntu-")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    supported = [classifier.rsplit(" :: ", 1)[1] for classifier in project["classifiers"]
                 if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", classifier)]
    # Strings: a bare 3.10 in YAML is the number 3.1.
    assert job["strategy"]["matrix"]["python-version"] == supported
    assert project["requires-python"] == f">={supported[0]}"
    (python,) = steps_using(job, "actions/setup-python")
    assert python["with"]["python-version"] == "${{ matrix.python-version }}"
    (node,) = steps_using(job, "actions/setup-node")
    assert node["with"]["node-version"] == 20
    assert [step["run"] for step in job["steps"] if "run" in step] == ["bash scripts/test.sh"]


def test_a_version_tag_builds_checks_and_publishes_with_trusted_publishing() -> None:
    flow = workflow("release.yml")
    assert flow["on"] == {"push": {"tags": ["v*"]}}
    assert flow["permissions"] == {"contents": "read"}  # no job but publish gets a token
    build, publish = flow["jobs"]["build"], flow["jobs"]["publish"]
    commands = "\n".join(step.get("run", "") for step in build["steps"])
    for command in ("python -m build", "twine check --strict dist/*", "pydistcheck"):
        assert command in commands
    assert steps_using(build, "actions/setup-node")[0]["with"]["node-version"] == 20
    assert publish["needs"] == "build"
    assert publish["environment"]["name"] == "pypi"
    assert publish["permissions"] == {"id-token": "write"}
    (upload,) = steps_using(publish, "pypa/gh-action-pypi-publish")
    assert "password" not in upload.get("with", {})  # trusted publishing: no token


@pytest.mark.parametrize(("tag", "section", "refusal"), [
    (f"v{VERSION}", f"## [{VERSION}] - 2026-12-01", None),
    (f"v{VERSION}", "## [Unreleased]", f"CHANGELOG.md has no section '## [{VERSION}]'"),
    (f"{VERSION}", f"## [{VERSION}] - 2026-12-01", f"does not name version {VERSION}"),
    ("v0.0.0", "## [0.0.0] - 2026-12-01", f"does not name version {VERSION}"),
])
def test_the_release_refuses_a_tag_without_its_version_or_changelog_section(
        tmp_path: Path, tag: str, section: str, refusal: str | None) -> None:
    (step,) = [step for step in workflow("release.yml")["jobs"]["build"]["steps"]
               if "_version.py" in step.get("run", "")]
    (tmp_path / "ipycloud").mkdir()
    shutil.copy(ROOT / "ipycloud" / "_version.py", tmp_path / "ipycloud")
    (tmp_path / "CHANGELOG.md").write_text(f"# Changelog\n\n{section}\n\n- Added things.\n")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", step["run"]], cwd=tmp_path,
                          env={**os.environ, "PATH": path, "GITHUB_REF_NAME": tag},
                          capture_output=True, text=True, check=False)
    if refusal is None:
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        assert done.returncode == 1 and refusal in done.stdout, done.stdout + done.stderr


def test_the_workflows_follow_github_actions_schema() -> None:
    """check-jsonschema's copy of the schema GitHub workflows follow (shipped in the package,
    no download): unknown keys, misspelt permissions and wrong types fail it."""
    run([str(Path(sys.executable).with_name("check-jsonschema")), "--builtin-schema",
         "vendor.github-workflows", *map(str, sorted(WORKFLOWS.glob("*.yml")))], timeout=120)
