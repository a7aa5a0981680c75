#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the whole suite.
# Usage: bash scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# torch is pinned to the CPU build; a bare "torch" would pull a multi-GB CUDA build.
# The editable install also builds the lab extension (labextension/, node 20) when its
# sources are newer than ipycloud/labextension/; under CI=true its yarn.lock is immutable.
# The docs extra: tests/test_docs.py builds the documentation site (mkdocs --strict) and runs
# every example on it and in README.
.venv/bin/python -m pip install --quiet -e '.[test,docs]' 'torch==2.13.0'
# The layers (pyproject.toml [tool.importlinter]): a back-edge between them fails here.
.venv/bin/lint-imports --no-cache
bash scripts/test_browser.sh  # Chromium, for the test that watches the dashboard in JupyterLab
bash scripts/test_fuse.sh  # fuse3 and libfuse2, for the storage tests' failing mount
bash scripts/test_xla.sh  # the XLA lane: torch_xla on its CPU device, in its own venv
bash scripts/test_cluster.sh  # SkyPilot reads the exported tasks, in its own venv
# pytest exits 5 when it collected no test: like any failure, that fails this script.
exec .venv/bin/python -m pytest "$@"
