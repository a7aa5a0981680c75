#!/usr/bin/env bash
# Make sure the fault-injecting file system of the storage tests (tests/faultfs.py) can
# mount: fusermount (Debian package fuse3) and libfuse.so.2 (libfuse2), which fusepy loads.
set -euo pipefail
if command -v fusermount >/dev/null 2>&1 \
        && PATH="$PATH:/sbin:/usr/sbin" ldconfig -p | grep -q 'libfuse\.so\.2 '; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" "the fault-injecting file system" fuse3 libfuse2
