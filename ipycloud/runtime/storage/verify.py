"""Checking files: safe file names, checksums given by the user, and what a file hashes to."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Expect:
    """What the caller told us a file must be: lower-case hex digests and a size."""

    sha256: str | None = None
    md5: str | None = None
    size: int | None = None

    @classmethod
    def given(cls, sha256: str | None = None, md5: str | None = None,
              size: int | None = None) -> Expect:
        """The expectation from user input; ValueError for a malformed digest or size."""
        if size is not None and size < 0:
            raise ValueError("size must be >= 0")
        return cls(normalise_digest(sha256, 64, "sha256"), normalise_digest(md5, 32, "md5"),
                   size)

    @property
    def anything(self) -> bool:
        """Whether there is anything to verify an existing file against."""
        return self.sha256 is not None or self.md5 is not None or self.size is not None

    def mismatch(self, digests: Mapping[str, str]) -> str | None:
        """A description of the first checksum that differs, or None when all match."""
        for kind, want in (("sha256", self.sha256), ("md5", self.md5)):
            if want is not None and digests.get(kind) != want:
                return f"{kind} expected {want}, got {digests.get(kind)}"
        return None

    def digests_of(self, path: Path) -> dict[str, str]:
        """The file's sha256, and its md5 when one is expected."""
        return hash_file(path, md5=self.md5 is not None)


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain file name; raise ValueError otherwise."""
    bad = {"/", "\\", "\0", os.sep, os.altsep or "/"}
    if not name or name in {".", ".."} or any(c in name for c in bad):
        raise ValueError(f"unsafe file name {name!r}: give a plain name without folders or '..'")
    return name


def name_or_none(name: str) -> str | None:
    """``name`` when it is a safe file name, else None."""
    try:
        return check_name(name)
    except ValueError:
        return None


def normalise_digest(value: str | None, length: int, kind: str) -> str | None:
    """A lower-case hex digest, or ValueError when it is not one."""
    if value is None:
        return None
    digest = value.strip().lower()
    if len(digest) != length or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"{kind} must be {length} hex digits")
    return digest


def hash_file(path: str | os.PathLike[str], md5: bool) -> dict[str, str]:
    """sha256 (and md5 when asked) of a file's bytes."""
    hashers = {"sha256": hashlib.sha256()}
    if md5:
        hashers["md5"] = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            for h in hashers.values():
                h.update(block)
    return {k: h.hexdigest() for k, h in hashers.items()}
