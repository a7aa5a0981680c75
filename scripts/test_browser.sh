#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the browser test (playwright drives it;
# `playwright install` is never run: it would download a browser of its own).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" "the browser test" chromium
