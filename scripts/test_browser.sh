#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the browser test (playwright drives it;
# `playwright install` is never run: it would download a browser of its own).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "scripts/test_browser.sh: Chromium is missing and this user cannot install it;" \
             "install the Debian package 'chromium' (apt-get install -y chromium)" >&2
        exit 1
    }
    as_root=(sudo)
fi
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq chromium >/dev/null
