"""The documentation: the site builds offline in strict mode (a broken link, reference or
page fails), every Python example on it and in README runs, and README stays a short front
page that opens with the notebook path."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_examples import ROOT, Example, examples, pages

README = ROOT / "README.md"
RUNNER = Path(__file__).with_name("run_markdown_page.py")
# Where a proxy would send any request: nothing answers there, so a build or an example that
# reaches for the network fails instead of fetching.
NO_NETWORK = {name: "http://127.0.0.1:9" for name in
              ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")}
# The examples that are shown but not run here, each with its reason on the page: a change to
# this count is deliberate.
NOT_RUN = 10


def offline_environment(home: Path) -> dict[str, str]:
    """This process's environment, with its own home folders and no network."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("IPYCLOUD_") and name.lower() != "no_proxy"}
    for name in ("HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        folder = home / name.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[name] = str(folder)
    return {**env, **NO_NETWORK, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}


def test_the_site_builds_offline_in_strict_mode(tmp_path: Path) -> None:
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=offline_environment(tmp_path / "home"), capture_output=True, text=True,
        timeout=280)
    assert build.returncode == 0, build.stderr[-4000:]
    reference = (site / "reference" / "training" / "index.html").read_text(encoding="utf-8")
    assert "Train <code>model</code> with <code>optimizer</code>" in reference
    tutorial = (site / "notebooks" / "03-training" / "index.html").read_text(encoding="utf-8")
    assert "ipycloud.fit: starting on cpu" in tutorial  # the notebook's stored output
    assert not [page for page in site.rglob("*.html")
                if "fonts.googleapis.com" in page.read_text(encoding="utf-8")]


def test_the_reference_heads_each_name_as_users_reach_it() -> None:
    # A name documented as ipycloud.X (or ipycloud.cluster.X) must be reachable so.
    headings = [heading for page in sorted((ROOT / "docs" / "reference").glob("*.md"))
                for heading in re.findall(r"^\s+heading: (\S+)$", page.read_text("utf-8"), re.M)]
    assert "ipycloud.fit" in headings
    unreachable = []
    for heading in headings:
        owner, _, name = heading.rpartition(".")
        namespace = importlib.import_module(owner)
        if not hasattr(namespace, name):
            unreachable.append(heading)
    assert unreachable == []


def page_examples() -> list[tuple[str, list[Example]]]:
    found = [(page.relative_to(ROOT).as_posix(), examples(page)) for page in pages()]
    return [(name, blocks) for name, blocks in found
            if any(block.not_run is None for block in blocks)]


@pytest.mark.parametrize("page,blocks", page_examples(), ids=[name for name, _ in page_examples()])
def test_the_examples_of_a_page_run_in_a_fresh_ipython(page: str, blocks: list[Example],
                                                        tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    runnable = [[block.line, block.code] for block in blocks if block.not_run is None]
    ran = subprocess.run([sys.executable, str(RUNNER)], input=json.dumps(runnable), cwd=work,
                         env=offline_environment(tmp_path / "home"), capture_output=True,
                         text=True, timeout=280)
    assert ran.returncode == 0, f"{page}:\n{ran.stdout[-6000:]}\n{ran.stderr[-3000:]}"


def test_few_examples_are_kept_from_running_and_each_says_why() -> None:
    kept = [block for page in pages() for block in examples(page) if block.not_run is not None]
    assert [block for block in kept if len(block.not_run or "") < 10] == []
    assert len(kept) == NOT_RUN, [(block.page, block.line, block.not_run) for block in kept]


def test_readme_links_to_files_of_the_repository() -> None:
    # README is no page of the site, so the strict build does not check its links.
    targets = re.findall(r"\]\(((?!https?://|#)[^)#]+)(?:#[^)]*)?\)", README.read_text("utf-8"))
    assert targets
    assert [target for target in targets if not (ROOT / target).is_file()] == []


def test_readme_is_a_short_front_page_that_opens_with_the_notebook_path() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    opening = [block for block in examples(README) if block.line <= 60]
    assert opening, "no notebook cell within README's first 60 lines"
    cells = "\n".join(block.code for block in opening)
    for step in ("%pip install ipycloud", "%load_ext ipycloud", "%gpuinfo", "checkpoint="):
        assert step in cells, step
