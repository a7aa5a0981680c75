"""The JSON Schemas of the server's route bodies (ipycloud/server/schema/): valid draft
2020-12 schemas, one for each route, shipped in the package, and strict enough that a body
which drifts from them fails. The real bodies are checked where the tests get them
(server_fixtures.Api.get, test_webpage.get_json, the readers' property tests); the lab
extension's types are generated from the same files (labextension/build-api-types.mjs,
checked by ``jlpm test``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from api_schema import ROUTES, check, route_schema, schemas
from jsonschema import Draft202012Validator, ValidationError

from ipycloud.runtime.monitor.host import HostProbe
from ipycloud.runtime.monitor.route_bodies import history, reading
from ipycloud.runtime.runs import runs
from ipycloud.runtime.runs.records import RECORD_FOLDER

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def test_each_route_has_a_valid_draft_2020_12_schema() -> None:
    shipped = schemas()
    assert set(ROUTES.values()) | {"error.json"} <= set(shipped)
    for name, schema in shipped.items():
        assert schema["$schema"] == DRAFT, name
        Draft202012Validator.check_schema(schema)
    assert route_schema("runs/a1b2c3d4e5f6") == "run.json"
    assert route_schema("kernels") == "kernels.json"


@pytest.fixture(scope="module")
def real_reading() -> dict[str, Any]:
    """The reading route's body of this machine, as the server builds it."""
    probe = HostProbe()
    probe.read()
    return reading(probe.read(), 1.0)


def test_a_reading_of_this_machine_and_its_history_hold_to_their_schemas(
        real_reading: dict[str, Any]) -> None:
    check("reading.json", real_reading)
    check("history.json", json.loads(history([], 1.0)))


@pytest.mark.parametrize("drift", [
    "a key added", "a key left out", "a number as text", "null for a count",
    "a GPU without its mig list"])
def test_a_body_that_drifts_from_its_schema_fails(real_reading: dict[str, Any],
                                                  drift: str) -> None:
    body = copy.deepcopy(real_reading)
    body["gpus"] = [{"index": 0, "name": "Tesla T4", "uuid": None, "utilization_percent": 3.0,
                     "memory_used": 1, "memory_total": 2, "temperature_c": None,
                     "power_w": None, "power_limit_w": None, "mig": []}]
    check("reading.json", body)
    if drift == "a key added":
        body["cpu"]["load"] = 1.0
    elif drift == "a key left out":
        del body["ram"]["peak"]
    elif drift == "a number as text":
        body["time"] = str(body["time"])
    elif drift == "null for a count":
        body["disks"] = [{"name": "home", "roles": ["home"], "paths": ["/root"],
                          "used": None, "available": 1, "total": 2}]
    else:
        del body["gpus"][0]["mig"]
    with pytest.raises(ValidationError):
        check("reading.json", body)


def test_a_run_whose_log_holds_fields_of_any_type_is_listed_as_the_schema_says(
        tmp_path: Path) -> None:
    """What a log says is not trusted: a start or an end whose fields are of other types
    gives a summary whose figures are those of the schema (null where the log's are not)."""
    logs = tmp_path / RECORD_FOLDER
    logs.mkdir()
    start = {"kind": "start", "t": 1_700_000_000.0, "step": 0, "epoch": 0, "notebook": 5,
             "pid": "42", "kernel": ["k"], "folder": {"a": 1}, "device": 0.5, "model": True,
             "host": 7}
    end = {"kind": "end", "t": 1_700_000_001.0, "step": 0, "epoch": 0, "status": "finished",
           "reason": 3, "best": {"metric": 1, "value": "low", "epoch": -1}}
    (logs / "a1b2c3d4e5f6.jsonl").write_text(f"{json.dumps(start)}\n{json.dumps(end)}\n")
    [run] = runs(tmp_path)
    summary = check("run-summary.json", run.to_json())
    assert {key: summary[key] for key in ("notebook", "pid", "kernel", "folder", "device",
                                          "model", "host", "reason", "best")} == dict.fromkeys(
        ("notebook", "pid", "kernel", "folder", "device", "model", "host", "reason", "best"))
