"""Properties of the server's routes, over inputs Hypothesis makes: any query parameter or
path segment a client sends is answered 200 or a 4xx with a one-line reason, never a 500;
any log, of records fit writes (with NaN and infinite figures) among lines of every hostile
kind, gives the run of its records in strict JSON."""

from __future__ import annotations

import json
import math
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from api_schema import ERROR, check, check_route, route_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_fixtures import *  # noqa: F403
from server_fixtures import Api
from strict_json import HOSTILE_RECORD_LINES, loads
from test_server_runs import LIVE, in_folder, inline, write_run

from ipycloud.runtime.runs import records
from ipycloud.server.runs import RunFinder

pytestmark = [pytest.mark.filterwarnings("error:Extension endpoints without"),
              pytest.mark.filterwarnings("ignore::ipycloud.runtime.runs.records.RunRecordWarning")]

ROUTE_EXAMPLES = settings(max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
LOG_EXAMPLES = settings(max_examples=300, deadline=None,
                        suppress_health_check=[HealthCheck.function_scoped_fixture,
                                               HealthCheck.too_slow])
# What a client can put in a URL: any text that UTF-8 can encode.
client_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
numbers_as_text = st.one_of(client_text, st.floats().map(repr), st.integers().map(str),
                            st.sampled_from(["", "nan", "-inf", "1e999", "0x10", " 5 "]))


def assert_answered(api: Api, *path: str, params: dict[str, str] | None = None) -> None:
    response = api.response(*path, params=params)
    assert response.code == 200 or 400 <= response.code < 500, (path, params, response.code)
    if path[:2] == ("ipycloud", "api"):
        body = json.loads(response.body)
        check(route_schema("/".join(path[2:])) if response.code == 200 else ERROR, body)
        if response.code != 200:
            assert body["message"] and "\n" not in body["message"]


@pytest.fixture
def served_run(jp_root_dir: Path) -> Path:
    return write_run(in_folder(jp_root_dir, LIVE), LIVE)


@ROUTE_EXAMPLES
@given(since=numbers_as_text)
def test_any_since_is_answered_without_a_server_error(api: Api, served_run: Path,
                                                      since: str) -> None:
    for route in ("history", "events", f"runs/{LIVE}"):
        assert_answered(api, "ipycloud", "api", *route.split("/"), params={"since": since})


@ROUTE_EXAMPLES
@given(segment=client_text.filter(lambda text: text not in ("", ".", "..")))
def test_any_run_or_kernel_id_is_answered_without_a_server_error(api: Api, served_run: Path,
                                                                 segment: str) -> None:
    quoted = urllib.parse.quote(segment, safe="")
    for route in ("runs", "kernels"):
        assert_answered(api, "ipycloud", "api", route, quoted)


@ROUTE_EXAMPLES
@given(params=st.dictionaries(client_text.filter(bool), client_text, max_size=3))
def test_any_parameters_of_the_routes_without_one_are_answered(
        api: Api, served_run: Path, params: dict[str, str]) -> None:
    for route in ("reading", "kernels", "runs"):
        assert_answered(api, "ipycloud", "api", route, params=params)
    assert_answered(api, "ipycloud", "page", params=params)


# Records as fit writes them, their other figures any JSON value (NaN and infinities too).
figures = st.dictionaries(st.sampled_from(["loss", "lr", "val_loss", "note", "best"]),
                          st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=5)
                                       | st.integers(), lambda inner: st.lists(inner, max_size=3),
                                       max_leaves=5), max_size=3)
counts = st.integers(0, 10**6)
record = st.tuples(st.sampled_from(records.KINDS), counts, counts, figures).map(
    lambda parts: {**parts[3], "kind": parts[0], "step": parts[1], "epoch": parts[2],
                   "status": "finished"})
hostile_line = st.one_of(
    st.sampled_from(HOSTILE_RECORD_LINES),
    st.binary(max_size=60).filter(lambda line: b"\n" not in line),
    st.tuples(st.sampled_from(records.KINDS), st.one_of(
        st.sampled_from([math.inf, -math.inf, math.nan, 1e300, -1.0]),
        st.integers(10**12, 10**400))).map(
        lambda parts: json.dumps({"t": parts[1], "kind": parts[0], "step": 1, "epoch": 0,
                                  "status": "x"})),
)
lines = st.lists(st.one_of(record.map(lambda line: ("good", line)),
                           hostile_line.map(lambda line: ("bad", line))), max_size=40)


def finite(value: Any) -> Any:
    """The value a strict answer gives for ``value``: a non-finite float, and an integer
    beyond 2**53 (JavaScript's exact range), is None."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


@LOG_EXAMPLES
@given(written=lines)
def test_any_log_gives_its_records_in_strict_json(tmp_path_factory: pytest.TempPathFactory,
                                                  written: list[tuple[str, Any]]) -> None:
    root = tmp_path_factory.mktemp("root")
    log = in_folder(root, LIVE)
    log.parent.mkdir(parents=True)
    good = []
    with log.open("wb") as file:
        for number, (kind, line) in enumerate(written):
            if kind == "good":
                line = {**line, "t": 1_700_000_000.0 + number}
                good.append(finite(line))
                file.write(json.dumps(line).encode() + b"\n")
            else:
                file.write((line if isinstance(line, bytes) else line.encode()) + b"\n")
    finder = RunFinder(root, background=inline)
    [run] = check_route("runs", loads(finder.runs_json(()).encode()))["runs"]
    assert run["id"] == LIVE
    answer = finder.run_json(LIVE, (), None)
    assert answer is not None
    assert check_route(f"runs/{LIVE}", loads(answer.encode()))["records"] == good
