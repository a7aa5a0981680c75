"""The price table: what an hour of each listed GPU instance costs, shipped as data.

``ipycloud/data/prices.json`` holds list prices, each with its source page and the date it
was read. A JSON file named by ``$IPYCLOUD_PRICES``, then the ``prices=`` argument, override
it entry by entry and field by field; a malformed one is refused with a one-line error that
names the file and the entry. NVML's GPU names ("Tesla T4", "NVIDIA A100-SXM4-80GB") are
matched to the table's GPU kinds ("T4", "A100 80GB") to guess the instance and to compare.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ipycloud.runtime.messages import os_reason
from ipycloud.runtime.untrusted import load_json, read_small

PRICES_ENV = "IPYCLOUD_PRICES"
SHIPPED = "ipycloud/data/prices.json"
MAX_FILE_BYTES = 16 << 20  # a price file longer than this is refused
PriceSource = str | os.PathLike[str] | Mapping[str, Any]

_FIELDS = ("gpu", "gpus", "usd_per_hour", "units_per_hour", "usd_per_unit", "source", "as_of",
           "verified", "note")
_RATE_FORMS = (("usd_per_hour",), ("units_per_hour", "usd_per_unit"))
_DESCRIPTION = ("source", "as_of", "verified", "note")  # about a figure, not the hardware
_KEY = re.compile(r"[A-Za-z0-9_.-]+:\S+")
_DATE = re.compile(r"\d{4}-\d{2}(-\d{2})?")
_SIZE = re.compile(r"(\d+)\s*GB", re.IGNORECASE)
_SIZE_TOLERANCE = 0.15  # a GPU with 39.6 GiB is an "A100 40GB"
# The platforms whose own price list tells the instance from the GPUs alone.
_PLATFORM_PROVIDERS = {"colab": "colab", "kaggle": "kaggle", "paperspace": "paperspace"}


class PriceError(ValueError):
    """A price file or mapping that cannot be used; the message names it and the entry."""


@dataclass(frozen=True)
class Cost:
    """What a run of ``hours`` costs on one instance, with where the rate comes from."""

    instance: str
    gpu: str
    gpus: int
    usd_per_hour: float
    units_per_hour: float | None  # Colab compute units; None elsewhere
    hours: float
    cost_usd: float
    compute_units: float | None  # Colab's units for the run; None elsewhere
    source: str
    as_of: str | None
    verified: bool
    note: str


@dataclass(frozen=True)
class InstancePrice:
    """One listed instance: its GPUs and its hourly rate."""

    key: str  # "provider:instance", e.g. "aws:g5.xlarge"
    gpu: str  # the GPU kind, e.g. "T4" or "A100 80GB"
    gpus: int
    usd_per_hour: float
    units_per_hour: float | None  # Colab compute units per hour; None elsewhere
    source: str
    as_of: str | None  # None only for a user's rate given without a date
    verified: bool
    note: str

    @property
    def provider(self) -> str:
        return self.key.split(":", 1)[0]

    def cost(self, hours: float) -> Cost:
        """The cost of ``hours`` on this instance."""
        units = None if self.units_per_hour is None else self.units_per_hour * hours
        return Cost(self.key, self.gpu, self.gpus, self.usd_per_hour, self.units_per_hour,
                    hours, self.usd_per_hour * hours, units, self.source, self.as_of, self.verified,
                    self.note)


@dataclass(frozen=True)
class PriceTable:
    """Every listed instance by key, and what the figures are (currency, region, date)."""

    about: str
    instances: Mapping[str, InstancePrice]

    def find(self, key: str) -> InstancePrice:
        """The instance named ``key`` (any letter case); ValueError naming close matches."""
        by_folded = {name.casefold(): name for name in self.instances}
        if key.casefold() in by_folded:
            return self.instances[by_folded[key.casefold()]]
        close = [by_folded[name] for name in
                 difflib.get_close_matches(key.casefold(), list(by_folded), n=5, cutoff=0.6)]
        known = f"close matches: {', '.join(close)}" if close else (
            f"listed: {', '.join(sorted(self.instances))}")
        raise ValueError(f"unknown instance {key!r} ({known}); add your own with prices=")

    def kind_of(self, name: str, memory_total: int | None) -> str | None:
        """The listed GPU kind of an NVML name, the size told by the GPU's memory (or by the
        name): "NVIDIA A100-SXM4-80GB" -> "A100 80GB"; the bare model when no listed size
        fits; None when no listed model is in the name."""
        kinds = {price.gpu for price in self.instances.values()}
        for token in re.split(r"[^A-Z0-9]+", name.upper()):
            models = sorted(kind for kind in kinds if kind.split()[0].upper() == token)
            if models:
                break
        else:
            return None
        size_gb = memory_total / 2**30 if memory_total else _size_gb(name)
        for kind in models:
            listed = _size_gb(kind)
            if listed and size_gb and abs(size_gb - listed) <= _SIZE_TOLERANCE * listed:
                return kind
        unsized = [kind for kind in models if _size_gb(kind) is None]
        return unsized[0] if unsized else token

    def guess(self, platform_key: str, platform_name: str,
              kinds: Sequence[str | None]) -> tuple[InstancePrice | None, str]:
        """The instance a platform with these GPU kinds (one per GPU) runs on, and how it was
        told; (None, why not) when the platform's price list does not tell it."""
        provider = _PLATFORM_PROVIDERS.get(platform_key)
        if provider is None:
            return None, f"the platform ({platform_name}) does not tell which instance this is"
        if not kinds:
            return None, f"no GPU was recorded, and no {platform_name} CPU rate is listed"
        listed = set(kinds)
        kind = listed.pop()
        if listed or kind is None:
            return None, f"the GPUs are of no single listed kind on {platform_name}"
        matches = [price for price in self.instances.values()
                   if price.provider == provider and price.gpu == kind and price.gpus == len(kinds)]
        if len(matches) != 1:
            return None, f"no single {provider} instance is listed with {len(kinds)} x {kind}"
        return matches[0], (f"guessed from the platform ({platform_name}) and the GPUs "
                            f"({len(kinds)} x {kind})")

    def comparable(self, gpus: int, exclude: str | None) -> tuple[str, list[InstancePrice]]:
        """The rule and the instances to compare a run on ``gpus`` GPUs with: those with the
        same number of GPUs, else with the fewest listed above it; cheapest first."""
        counts = sorted({price.gpus for price in self.instances.values() if price.gpus >= gpus})
        if not gpus or not counts:
            return (("no GPU was recorded" if not gpus else
                     f"no listed instance has {gpus} or more GPUs"), [])
        count = counts[0]
        rule = f"instances with {count} GPU{'' if count == 1 else 's'}" + (
            "" if count == gpus else f" (none is listed with {gpus})")
        listed = [price for price in self.instances.values()
                  if price.gpus == count and price.key != exclude]
        return rule, sorted(listed, key=lambda price: (price.usd_per_hour, price.key))


def load_prices(prices: PriceSource | None = None,
                environ: Mapping[str, str] | None = None) -> PriceTable:
    """The shipped table, overridden by the file in ``$IPYCLOUD_PRICES``, then by ``prices``
    (a JSON file or a mapping; either ``{"instances": {key: fields}}`` or ``{key: fields}``).

    A user's entry changes the fields it gives; its ``source`` defaults to where it came from,
    ``as_of`` to unknown and ``verified`` to true. Giving one form of rate (``usd_per_hour``,
    or ``units_per_hour`` with ``usd_per_unit``) drops the other.
    """
    document = _read_json(SHIPPED, resources.files("ipycloud").joinpath("data/prices.json")
                          .read_text)
    about = str(document.get("about", "")) if isinstance(document, Mapping) else ""
    entries = {key: (dict(fields), SHIPPED) for key, fields in _entries(SHIPPED, document)}
    environ = os.environ if environ is None else environ
    overrides = []
    if environ.get(PRICES_ENV):
        overrides.append(_document(environ[PRICES_ENV], f"{PRICES_ENV}={environ[PRICES_ENV]}"))
    if prices is not None:
        overrides.append(_document(prices))
    for origin, override in overrides:
        for key, fields in _entries(origin, override):
            base = entries[key][0] if key in entries else {}
            entries[key] = (_merge(base, fields, origin), origin)
    return PriceTable(about, {key: _entry(key, fields, origin)
                              for key, (fields, origin) in entries.items()})


def _document(prices: PriceSource, origin: str | None = None) -> tuple[str, Any]:
    """(where it came from, the parsed document) of a mapping or a JSON file."""
    if isinstance(prices, Mapping):
        return origin or "prices mapping", prices
    path = Path(prices)
    origin = origin or str(path)
    return origin, _read_json(origin, lambda: read_small(path, MAX_FILE_BYTES, follow_links=True))


def _read_json(origin: str, read: Callable[[], bytes | str]) -> Any:
    """The JSON document ``read`` gives; PriceError (one line) for a file that cannot be
    read (not a regular file, too large) or is not JSON."""
    try:
        text = read()
    except (OSError, ValueError) as error:  # ValueError: too large, or text not UTF-8
        reason = os_reason(error) or error
        raise PriceError(f"{origin}: cannot read the price file: {reason}") from None
    try:
        return load_json(text)
    except json.JSONDecodeError as error:
        raise PriceError(f"{origin}: not valid JSON: {error.msg} at line {error.lineno} "
                         f"column {error.colno}") from None
    except ValueError as error:  # nested too deep, bytes that are not UTF-8
        raise PriceError(f"{origin}: not valid JSON: {type(error).__name__}") from None


def _entries(origin: str, document: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """The (key, fields) of a price document, checked for shape."""
    if not isinstance(document, Mapping):
        raise PriceError(f"{origin}: expected a JSON object of instances, "
                         f"got {type(document).__name__}")
    if "instances" in document:
        if document.get("currency", "USD") != "USD":
            raise PriceError(f"{origin}: only USD prices are supported, "
                             f"got currency {document['currency']!r}")
        document = document["instances"]
        if not isinstance(document, Mapping):
            raise PriceError(f"{origin}: \"instances\" must be an object of instances")
    for key, fields in document.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise PriceError(f"{origin}: entry {key!r}: name entries provider:instance, "
                             f"e.g. 'aws:g5.xlarge'")
        if not isinstance(fields, Mapping):
            raise PriceError(f"{origin}: entry {key!r}: expected an object of fields")
        unknown = sorted(set(fields) - set(_FIELDS))
        if unknown:
            raise PriceError(f"{origin}: entry {key!r}: unknown field {unknown[0]!r} "
                             f"(known: {', '.join(_FIELDS)})")
    return list(document.items())


def _merge(base: Mapping[str, Any], fields: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """A user's fields over a listed entry's hardware (and the rate form it did not give)."""
    dropped = set(_DESCRIPTION)
    for form in _RATE_FORMS:
        if any(name in fields for name in form):
            dropped |= {name for other in _RATE_FORMS if other != form for name in other}
    kept = {name: value for name, value in base.items() if name not in dropped}
    return {"source": origin, "as_of": None, "verified": True, **kept, **fields}


def _entry(key: str, fields: Mapping[str, Any], origin: str) -> InstancePrice:
    """One checked entry; PriceError names the origin, the entry and the problem."""

    def fail(problem: str) -> PriceError:
        return PriceError(f"{origin}: entry {key!r}: {problem}")

    def rate(name: str) -> float:
        value = fields.get(name)
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value < 0):
            raise fail(f"{name} must be a finite number >= 0, got {value!r}")
        return float(value)

    gpu, gpus = fields.get("gpu"), fields.get("gpus")
    if not isinstance(gpu, str) or not gpu.strip():
        raise fail("gpu must name the GPU kind, e.g. \"T4\" or \"A100 80GB\"")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise fail(f"gpus must be a whole number >= 0, got {gpus!r}")
    per_hour, per_unit = (any(name in fields for name in form) for form in _RATE_FORMS)
    if per_hour == per_unit:
        raise fail("give usd_per_hour, or units_per_hour with usd_per_unit (one of the two)")
    units = rate("units_per_hour") if per_unit else None
    usd = rate("usd_per_hour") if per_hour else rate("usd_per_unit") * (units or 0.0)
    source, as_of = fields.get("source"), fields.get("as_of")
    if not isinstance(source, str) or not source.strip():
        raise fail("source must name where the rate comes from (the pricing page's URL)")
    if not (as_of is None and origin != SHIPPED) and not (
            isinstance(as_of, str) and _DATE.fullmatch(as_of)):
        raise fail(f"as_of must be the date the rate was read, YYYY-MM or YYYY-MM-DD, "
                   f"got {as_of!r}")
    verified, note = fields.get("verified"), fields.get("note", "")
    if not isinstance(verified, bool):
        raise fail(f"verified must be true or false, got {verified!r}")
    if not isinstance(note, str):
        raise fail(f"note must be text, got {note!r}")
    return InstancePrice(key, gpu.strip(), gpus, usd, units, source, as_of, verified, note)


def _size_gb(text: str) -> int | None:
    """The memory size a GPU kind or name states ("A100 80GB" -> 80), if it states one."""
    found = _SIZE.search(text)
    return int(found.group(1)) if found else None
