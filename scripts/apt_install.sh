#!/usr/bin/env bash
# Install Debian packages for the tests, as root or through sudo.
# Usage: bash scripts/apt_install.sh WHAT_FOR PACKAGE...
set -euo pipefail
what_for=$1
shift
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "scripts/apt_install.sh: $what_for needs the Debian packages '$*' and this user" \
             "cannot install them; install them as root: apt-get install -y $*" >&2
        exit 1
    }
    as_root=(sudo)
fi
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq "$@" >/dev/null
