"""The notebook's own package versions, pinned for the nodes.

A module maps to the installed distributions that provide it
(``importlib.metadata.packages_distributions``). A local build tag is dropped
(``torch 2.5.1+cu121`` is pinned ``torch==2.5.1``): such builds live on their vendor's
index, and PyPI's build of the same version is what a node installs.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ipycloud._version import __version__

# Always on the nodes: ipycloud runs the task, cloudpickle loads a function.
ALWAYS = ("ipycloud", "cloudpickle")


@dataclass(frozen=True)
class Pin:
    """One requirement: ``name==version``; ``installed`` is the version found here."""

    name: str
    version: str
    installed: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def dropped_tag(self) -> bool:
        return self.version != self.installed


class Installed:
    """The installed distributions, by the top-level modules they provide (read once)."""

    def __init__(self) -> None:
        self.by_module: Mapping[str, list[str]] = importlib.metadata.packages_distributions()

    def provides(self, top_level: str) -> bool:
        """Whether an installed distribution provides the top-level module (ipycloud
        always: an editable install maps no module to it)."""
        return top_level in ALWAYS or top_level in self.by_module

    def pins(self, modules: Iterable[str]) -> list[Pin]:
        """The pins for top-level ``modules`` (those no installed package provides left
        out) and for ipycloud and cloudpickle, sorted by name, each distribution once."""
        names = set(ALWAYS)
        for module in modules:
            names.update(self.by_module.get(module, ()))
        return sorted((_pin(name) for name in names), key=lambda pin: pin.name.lower())


def _pin(name: str) -> Pin:
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "ipycloud":
            raise
        installed = __version__  # run from a checkout that is not installed
    return Pin(name, installed.partition("+")[0], installed)


def requirements_text(pinned: list[Pin], python: str) -> str:
    """A requirements file: one pin a line, each dropped build tag said in a comment."""
    lines = [f"# The notebook's versions (Python {python}), pinned by ipycloud.cluster.export."]
    for pin in pinned:
        if pin.dropped_tag:
            lines.append(f"# {pin.name} {pin.installed} here: pinned without its local build "
                         "tag, PyPI's build for the node")
        lines.append(str(pin))
    return "\n".join(lines) + "\n"
