"""The JSON Schemas of the server's route bodies (ipycloud/server/schema/, shipped in the
package), and the check every test that reads a real body puts it to: a body that drifts
from its schema fails the test that got it."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SCHEMA_DIR = files("ipycloud.server") / "schema"

# The schema of each route's answer, by the route's path under ipycloud/api/ (an id
# written as <id>).
ROUTES = {
    "reading": "reading.json",
    "history": "history.json",
    "kernels": "kernels.json",
    "kernels/<id>": "kernel.json",
    "events": "events.json",
    "runs": "runs.json",
    "runs/<id>": "run.json",
}
ERROR = "error.json"  # the body of a 4xx or 503


def schemas() -> dict[str, Any]:
    """Every schema file, by name."""
    return {entry.name: json.loads(entry.read_text()) for entry in SCHEMA_DIR.iterdir()
            if entry.name.endswith(".json")}


@cache
def _registry() -> Registry:
    return Registry().with_resources(
        (name, Resource.from_contents(schema, default_specification=DRAFT202012))
        for name, schema in schemas().items())


def check(schema: str, body: Any) -> Any:
    """``body`` if it holds to the schema named ``schema``; else the test fails naming the
    first difference. Every $ref resolves among the shipped files."""
    registry = _registry()
    validator = Draft202012Validator(registry.contents(schema), registry=registry)
    validator.validate(body)
    return body


def route_schema(route: str) -> str:
    """The schema of the answer to ``route`` (``runs/a1b2c3d4e5f6``: ``run.json``)."""
    collection, _, item = route.partition("/")
    return ROUTES[f"{collection}/<id>" if item else collection]


def check_route(route: str, body: Any) -> Any:
    """``body``, the answer to ``route``, if it holds to that route's schema."""
    return check(route_schema(route), body)
