#!/usr/bin/env bash
# The XLA lane: tests_xla/ on torch_xla's CPU device, in a venv of its own.
# torch_xla pins an exact torch, so it cannot share .venv (which has torch 2.13.0).
# The venv lives outside the checkout; it is rebuilt from scratch when torch_xla does not
# import in it, and brought up to date on every run (quick once everything is there).
# Usage: bash scripts/test_xla.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${IPYCLOUD_XLA_VENV:-$HOME/.cache/ipycloud/xla-venv-2.9.0}"
. scripts/lane_venv.sh
lane_venv "$venv" torch_xla "torch 2.9.0 + torch_xla 2.9.0, about 7 GB"
# One resolve with both pins, so ipycloud's own dependencies (from pyproject.toml) can never
# move torch; torch_xla 2.9.0 needs exactly torch 2.9.0.
"$venv/bin/python" -m pip install --quiet --no-cache-dir 'torch==2.9.0' 'torch_xla==2.9.0' -e '.[xla]' \
    numpy pytest pytest-timeout
# Naming tests_xla overrides pyproject's testpaths (tests/); pyproject's other settings apply.
PJRT_DEVICE=CPU exec "$venv/bin/python" -m pytest --rootdir "$PWD" tests_xla -q "$@"
