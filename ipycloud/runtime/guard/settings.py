"""The session guard's settings, checked on creation: each mistake is one line."""

from __future__ import annotations

from dataclasses import dataclass

from ipycloud.runtime.units import format_seconds

_DAY = 86400
MAX_INTERVAL_S = _DAY
MAX_LIMIT_S = 30 * _DAY
MAX_GRACE_S = 600


@dataclass(frozen=True)
class GuardSettings:
    """What the guard does; ValueError (one line) for values that make no sense."""

    interval_s: float = 60.0  # between activity pings
    limit_s: float | None = None  # session limit; None: the platform's
    warnings_s: tuple[float, ...] = (900.0, 300.0)  # warn and run the actions this long before
    grace_s: float = 25.0  # the longest SIGTERM waits for the actions
    browser: bool | None = None  # Colab's browser-side ping; None: on Colab only

    def __post_init__(self) -> None:
        _check_range("interval", self.interval_s, MAX_INTERVAL_S)
        _check_range("grace period", self.grace_s, MAX_GRACE_S)
        if self.limit_s is not None:
            _check_range("session limit", self.limit_s, MAX_LIMIT_S)
        for warning in self.warnings_s:
            _check_range("warning", warning, MAX_LIMIT_S)
        object.__setattr__(self, "warnings_s", tuple(sorted(set(self.warnings_s), reverse=True)))

    def check_limit(self, limit_s: float) -> None:
        """ValueError when the earliest warning does not fall inside the session."""
        if self.warnings_s and self.warnings_s[0] >= limit_s:
            raise ValueError(
                f"the session limit {format_seconds(limit_s)} is not longer than the "
                f"{format_seconds(self.warnings_s[0])} warning: give a longer limit or later "
                "warnings (e.g. 5m,1m)")


def _check_range(what: str, value: float, maximum: float) -> None:
    if not 0 < value <= maximum:  # also refuses NaN
        raise ValueError(f"the {what} must be more than 0 s and at most "
                         f"{format_seconds(maximum)}, got {format_seconds(value)}")
