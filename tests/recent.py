"""A recent time for tests whose runs are written "now" on another host (fresh for ten
minutes): such a module keeps it in ``T`` and imports ``recent_time``, an autouse
fixture that sets ``T`` again for each test, since the module is imported when the
session starts, maybe more than ten minutes before its tests run."""

from __future__ import annotations

import time

import pytest


def now() -> float:
    return float(int(time.time()))


@pytest.fixture(autouse=True)
def recent_time(request: pytest.FixtureRequest) -> None:
    request.module.T = now()
