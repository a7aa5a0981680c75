#!/usr/bin/env bash
# The cluster lane: the tests that read exported tasks with SkyPilot's own parser (marker
# skypilot), in a venv of their own. skypilot 0.14.1 requires click<8.2, while .venv's
# check-jsonschema, huggingface_hub and import-linter require a newer click: installed
# there, it would break them, and resolved together they would be held back.
# The venv lives outside the checkout; it is rebuilt from scratch when SkyPilot does not
# import in it, and brought up to date on every run (quick once everything is there).
# Usage: bash scripts/test_cluster.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${IPYCLOUD_CLUSTER_VENV:-$HOME/.cache/ipycloud/cluster-venv-0.14.1}"
. scripts/lane_venv.sh
lane_venv "$venv" sky "skypilot 0.14.1 + torch 2.13.0"
# One resolve with the test tools (tests/conftest.py loads their fixtures) and the pins.
"$venv/bin/python" -m pip install --quiet --no-cache-dir 'torch==2.13.0' -e '.[test,cluster]'
"$venv/bin/python" -m pip check
exec "$venv/bin/python" -m pytest -m skypilot tests/test_cluster_export.py -q "$@"
