"""The OpenAPI document names the enums: call kind, outcome and bound, turn and agent status."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from inference.models import InferenceCall, Turn

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    from interfaces.api.routes import api

    return api.get_openapi_schema()["components"]["schemas"]


def _enum(prop: dict[str, Any], schemas: dict[str, Any]) -> list[str]:
    if "$ref" in prop:  # an enum of the models' own choices is a component of its own
        prop = schemas[prop["$ref"].rsplit("/", 1)[1]]
    if "enum" in prop:
        return list(prop["enum"])
    for branch in prop.get("anyOf", []):
        if "enum" in branch or "$ref" in branch:
            return _enum(branch, schemas)
    raise AssertionError(f"not an enum: {prop}")


@pytest.mark.parametrize(
    ("schema", "field", "choices"),
    [
        ("CallOut", "kind", InferenceCall.Kind.values),
        ("CallOut", "outcome", InferenceCall.Outcome.values),
        ("CallOut", "bound", InferenceCall.Bound.values),
        ("TurnOut", "status", Turn.Status.values),
        ("TurnAccepted", "status", Turn.Status.values),
        ("AgentOut", "status", ["idle", "queued", "running", "held", "requires_action"]),
    ],
)
def test_the_openapi_document_lists_each_enum_as_the_models_define_it(
    schemas: dict[str, Any], schema: str, field: str, choices: list[str]
) -> None:
    assert sorted(_enum(schemas[schema]["properties"][field], schemas)) == sorted(choices)


def test_get_agents_is_in_the_document_with_its_filters(api: Client) -> None:
    document = api.get("/api/v1/openapi.json").json()
    params = {p["name"] for p in document["paths"]["/api/v1/agents"]["get"]["parameters"]}
    assert {"status", "project", "limit", "offset"} <= params
