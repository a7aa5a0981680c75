"""Where alerts go: the Apprise URLs saved in ``<config dir>/notify.json`` (mode 0600) and
those of ``$IPYCLOUD_NOTIFY`` (comma-separated). A URL holds its service's secret (a token,
a password, a private topic): it is written only to that file and shown only masked.

The config folder is ``$IPYCLOUD_CONFIG_DIR``, else the user's (``~/.config/ipycloud``).
ipycloud makes it with mode 0700; one that is a symbolic link or belongs to another user
is refused, and one that others can write to is made 0700 before it is used.
"""

from __future__ import annotations

import json
import os
import re
import stat
import urllib.parse
from pathlib import Path
from typing import Any

from ipycloud.runtime._optional import require
from ipycloud.runtime.durable import write_bytes_atomically
from ipycloud.runtime.messages import os_reason
from ipycloud.runtime.notify.quiet import quieted
from ipycloud.runtime.untrusted import load_json, read_small

CONFIG_DIR_ENV = "IPYCLOUD_CONFIG_DIR"
URLS_ENV = "IPYCLOUD_NOTIFY"
FILE_NAME = "notify.json"
MAX_FILE_BYTES = 1 << 20  # far more than any list of alert URLs
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")  # RFC 3986's


def config_file() -> Path:
    """``notify.json`` in the user's ipycloud config folder."""
    given = os.environ.get(CONFIG_DIR_ENV)
    if given:
        return Path(given).expanduser() / FILE_NAME
    from platformdirs import user_config_path

    return user_config_path("ipycloud") / FILE_NAME


def saved_urls() -> list[str]:
    """The URLs saved in ``notify.json`` (none without the file); ValueError (one line) for
    a file that is not what ipycloud writes, or a config folder refused (``private_folder``)."""
    path = config_file()
    private_folder(path.parent)
    try:
        content = load_json(read_small(path, MAX_FILE_BYTES, follow_links=True))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:  # not a regular file, too large, not JSON
        reason = os_reason(error) or type(error).__name__
        raise ValueError(f"cannot read {path}: {reason}: fix or delete it") from None
    urls = content.get("urls") if isinstance(content, dict) else None
    if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls):
        raise ValueError(f"{path} holds no list of URLs under \"urls\": fix or delete it")
    return urls


def environment_urls() -> list[str]:
    """The URLs of ``$IPYCLOUD_NOTIFY``, comma-separated."""
    return [url.strip() for url in os.environ.get(URLS_ENV, "").split(",") if url.strip()]


def all_urls() -> list[str]:
    """Every URL an alert goes to: the saved ones, then the environment's, each once."""
    return list(dict.fromkeys([*saved_urls(), *environment_urls()]))


def add_url(url: str) -> str:
    """Save ``url`` (an Apprise URL: ``ntfy://ntfy.sh/topic``, ``tgram://token/chat``...)
    for every later alert; returns it masked. ValueError (one line, nothing written) for a
    URL Apprise cannot read; ImportError naming the extra without Apprise."""
    url = url.strip()
    check_url(url)
    urls = saved_urls()
    if url not in urls:
        _write([*urls, url])
    return mask(url)


def remove_url(which: str | int) -> str:
    """Forget a saved URL, given whole or by its number in ``list_urls()`` (from 1);
    returns it masked. ValueError (one line) when none matches."""
    urls = saved_urls()
    if isinstance(which, int) or which.strip().isdigit():
        number = int(which)
        if not 1 <= number <= len(urls):
            listed = len(urls) + len(environment_urls())
            if len(urls) < number <= listed:
                raise ValueError(f"alert URL {number} comes from ${URLS_ENV}: change that "
                                 "variable to remove it")
            raise ValueError(f"no saved alert URL number {number}: there are {len(urls)} "
                             "(see the list)")
        url = urls[number - 1]
    elif which.strip() in urls:
        url = which.strip()
    else:
        raise ValueError(f"{mask(which)} is not a saved alert URL: give its number in the list")
    _write([saved for saved in urls if saved != url])
    return mask(url)


def list_urls() -> list[str]:
    """Every URL alerts go to, masked, numbered as ``remove_url`` takes them: the saved
    ones, then those of ``$IPYCLOUD_NOTIFY`` (marked so)."""
    saved = saved_urls()
    from_environment = [url for url in environment_urls() if url not in saved]
    return [mask(url) for url in saved] + [f"{mask(url)} (${URLS_ENV})"
                                           for url in from_environment]


def check_url(url: str) -> None:
    """ValueError (one line) unless Apprise can send to ``url``."""
    apprise = require("apprise", "notify")
    if instantiate(apprise, url) is None:
        shown = mask(url) if "://" in url else "the text given"
        raise ValueError(f"{shown} is not a URL Apprise can send to: see "
                         "https://github.com/caronc/apprise/wiki for each service's form")


def instantiate(apprise: Any, url: str) -> Any:
    """Apprise's service for ``url``, None where Apprise cannot read it (some malformed URLs
    make it raise rather than answer None), with its logs kept in."""
    with quieted():
        try:
            return apprise.Apprise.instantiate(url) if url else None
        except Exception:
            return None


def mask(url: str) -> str:
    """``url`` without its secrets: the scheme, the host when it is a host name or an
    address (not a token in its place), then ``…``: ``ntfy://ntfy.sh/…``, ``tgram://…``."""
    scheme, separator, rest = url.strip().partition("://")
    if not separator or not _SCHEME.fullmatch(scheme):  # at most a scheme before a colon
        head, colon, _ = url.strip().partition(":")
        return f"{head}:…" if colon and head.isalpha() else "…"
    try:
        parts = urllib.parse.urlsplit(f"x://{rest}")
        host, port = parts.hostname or "", parts.port
    except ValueError:
        host, port = "", None
    if not _looks_like_host(host):
        return f"{scheme}://…"
    return f"{scheme}://{host}{f':{port}' if port else ''}/…"


def secret_parts(url: str) -> list[str]:
    """Every part of ``url`` that may be a secret, as written and decoded: the URL, its
    user and password, each segment of its path, each value of its query, and its host
    when that is not a host name (a token in its place)."""
    rest = url.strip().partition("://")[2]
    try:
        parts = urllib.parse.urlsplit(f"x://{rest}")
        user, password, host = parts.username, parts.password, parts.hostname or ""
    except ValueError:  # not a URL urllib reads: the whole of it is the secret
        return [url, rest]
    found = [url, rest, user or "", password or "", *parts.path.split("/"),
             *(value for _, value in urllib.parse.parse_qsl(parts.query))]
    if not _looks_like_host(host):
        found.append(parts.netloc)
    return list(dict.fromkeys(text for part in found if part
                              for text in (part, urllib.parse.unquote(part))))


def private_folder(folder: Path) -> None:
    """Refuse (ValueError, one line) a config folder that is a symbolic link, not a folder,
    or another user's; make one that others can write to 0700. Nothing when it is missing."""
    try:
        info = folder.lstat()
    except FileNotFoundError:
        return
    why = ("is a symbolic link" if stat.S_ISLNK(info.st_mode)
           else "is not a folder" if not stat.S_ISDIR(info.st_mode)
           else "belongs to another user" if info.st_uid != os.geteuid()
           else None)
    if why is not None:
        raise ValueError(f"{folder} {why}: ipycloud keeps alert URLs only in a folder of "
                         f"yours (see ${CONFIG_DIR_ENV})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        folder.chmod(0o700)


def _looks_like_host(host: str) -> bool:
    """A name with a dot (``ntfy.sh``, ``127.0.0.1``) or ``localhost``: a token rarely is."""
    return host == "localhost" or ("." in host and not host.startswith("."))


def _write(urls: list[str]) -> None:
    path = config_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_folder(path.parent)
    data = json.dumps({"urls": urls}, indent=2).encode() + b"\n"
    write_bytes_atomically(path, data, mode=0o600)
