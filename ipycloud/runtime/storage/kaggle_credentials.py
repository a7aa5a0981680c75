"""Kaggle credentials for kagglehub: where they are found, and keeping them out of text.

First found wins: ``KAGGLE_USERNAME``/``KAGGLE_KEY``; ``kaggle.json`` in
``$KAGGLE_CONFIG_DIR`` (default ``~/.kaggle``); ``kaggle.json`` in the mounted project
folder or the storage root above it, which is copied to the config folder with mode 0600
(from the moment it exists). Keys are never printed: ``KaggleAuth.scrub`` removes them,
and the Basic token that carries them, from any text.
"""

from __future__ import annotations

import base64
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ipycloud.runtime.durable import write_bytes_atomically
from ipycloud.runtime.messages import scrub
from ipycloud.runtime.storage.errors import StorageError
from ipycloud.runtime.storage.mount import last_mount
from ipycloud.runtime.untrusted import TooLarge, load_json, read_small

__all__ = ["KaggleAuth", "KaggleError", "find_credentials", "no_credentials"]

CREDENTIALS_FILE = "kaggle.json"
MAX_CREDENTIALS_BYTES = 64 << 10  # a kaggle.json is under 100 bytes
WEB = "https://www.kaggle.com"


class KaggleError(StorageError):
    """A Kaggle download that could not complete; the message is one line and says what to do."""


@dataclass(frozen=True)
class KaggleAuth:
    """Where the credentials came from (for messages) and the strings to scrub."""

    source: str | None
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def scrub(self, text: str) -> str:
        """``text`` on one line with every secret replaced by ``***``."""
        return scrub(text, self.secrets)


def _config_folder() -> Path:
    """Where kagglehub looks for kaggle.json: ``$KAGGLE_CONFIG_DIR`` or ``~/.kaggle``."""
    from kagglehub import config

    if config.CREDENTIALS_FOLDER_ENV_VAR_NAME in os.environ:
        return Path(os.environ[config.CREDENTIALS_FOLDER_ENV_VAR_NAME])
    return Path(config.DEFAULT_KAGGLE_CREDENTIALS_FOLDER)


def _project_files() -> list[Path]:
    """kaggle.json candidates in the mounted project folder and the storage root above it."""
    mounted = last_mount()
    if mounted is None:
        return []
    return [mounted.project / CREDENTIALS_FILE, mounted.project.parent / CREDENTIALS_FILE]


def _secrets(username: str, key: str) -> tuple[str, ...]:
    """The key, and the Basic Authorization token that carries it."""
    token = base64.b64encode(f"{username}:{key}".encode()).decode("ascii")
    return tuple(s for s in (key, token, token.rstrip("=")) if s)


def _read_kaggle_json(path: Path) -> tuple[bytes, str, str]:
    """(raw bytes, username, key) of a kaggle.json; KaggleError naming only the file (one
    that is not a regular file, or too large, is refused without reading it all)."""
    parsed: object = None
    try:
        raw = read_small(path, MAX_CREDENTIALS_BYTES, follow_links=True)
    except TooLarge:
        raw = b""  # refused below, as any text that is not a kaggle.json
    except OSError as error:
        raise KaggleError(f"cannot read {path}: {error.strerror or type(error).__name__}"
                          ) from None
    with contextlib.suppress(ValueError):  # not JSON, or nested too deep
        parsed = load_json(raw)
    user = parsed.get("username") if isinstance(parsed, dict) else None
    key = parsed.get("key") if isinstance(parsed, dict) else None
    if isinstance(user, str) and isinstance(key, str) and user.strip() and key.strip():
        return raw, user, key
    raise KaggleError(f"{path} is not a valid kaggle.json (JSON with \"username\" and \"key\" "
                      f"is expected): download a new one from {WEB}/settings")


def _install_credentials(source: Path, raw: bytes, folder: Path) -> Path:
    """Copy kaggle.json into ``folder`` atomically, readable by its owner only from the start."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = folder / CREDENTIALS_FILE
    try:
        write_bytes_atomically(final, raw, mode=0o600)
    except OSError as error:
        raise KaggleError(f"cannot copy {source} to {final}: "
                          f"{error.strerror or type(error).__name__}") from None
    print(f"ipycloud: copied {source} to {final} (mode 600) for kagglehub")
    return final


def find_credentials() -> KaggleAuth:
    """Find (and, from the project folder, install) credentials; what kagglehub will use."""
    from kagglehub.config import get_kaggle_credentials

    source, secrets = _our_credentials()
    try:
        found = get_kaggle_credentials()  # also login(), KAGGLE_API_TOKEN, Colab secrets
    except ValueError:
        found = None
    if found is not None:
        secrets += tuple(s for s in (found.key, found.api_key) if s)
        if found.username and found.key:
            secrets += _secrets(found.username, found.key)
        source = source or "kagglehub's login or API token"
    return KaggleAuth(source, secrets)


def _our_credentials() -> tuple[str | None, tuple[str, ...]]:
    """(source, secrets) from the three places, first found wins; (None, ()) when none."""
    user, key = os.environ.get("KAGGLE_USERNAME"), os.environ.get("KAGGLE_KEY")
    if user and key:
        return "KAGGLE_USERNAME/KAGGLE_KEY", _secrets(user, key)
    folder = _config_folder()
    own = folder / CREDENTIALS_FILE
    if own.is_file():
        _, user, key = _read_kaggle_json(own)
        return str(own), _secrets(user, key)
    for candidate in _project_files():
        if candidate.is_file():
            raw, user, key = _read_kaggle_json(candidate)
            return str(_install_credentials(candidate, raw, folder)), _secrets(user, key)
    return None, ()


def no_credentials(what: str) -> str:
    """The one-line message listing the places credentials are looked for."""
    folder = str(_config_folder())
    project = last_mount()
    place = f"{project.project}/{CREDENTIALS_FILE}" if project else "the mounted project folder"
    return (f"{what} needs Kaggle credentials: set KAGGLE_USERNAME and KAGGLE_KEY, or put "
            f"kaggle.json (from {WEB}/settings) in {folder} or in {place}")
