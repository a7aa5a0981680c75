"""MkDocs hook: the tutorials in notebooks/ become pages of the site (notebooks/NAME/),
rendered by mkdocs-jupyter from the copies in the repository with their stored outputs,
never executed here; so the notebooks live in one place."""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


@event_priority(100)  # before mkdocs-jupyter, which makes pages of the notebooks it finds
def on_files(files: Files, config: MkDocsConfig) -> Files:
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(File(notebook.relative_to(ROOT).as_posix(), src_dir=str(ROOT),
                          dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files
