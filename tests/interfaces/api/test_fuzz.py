"""The API against its own OpenAPI document, fuzzed (schemathesis): every operation, with an
operator token and with a non-operator token, never answers a 5xx, and every answer conforms
to the document (its status codes, content types and response schemas).

Bounded for ``make test`` (``AGENTOPS_FUZZ_EXAMPLES`` examples per operation and token, 50 by
default); ``make fuzz`` runs many more."""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from agentops.tokens import api_token_create
from tests.factories import AgentFactory, ProviderFactory

EXAMPLES = int(os.environ.get("AGENTOPS_FUZZ_EXAMPLES", "50"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
# Valid and invalid input both, NUL characters allowed where schemathesis puts them (bodies; it
# keeps them out of paths and queries, which tests/interfaces/api/test_hostile_input.py covers by
# hand).
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], allow_x00=True
)


@pytest.fixture(params=["operator", "user"])
def token(request: pytest.FixtureRequest, transactional_db: None) -> str:
    # Something for the fuzzer to find: an agent of each kind of token's project, with history.
    provider = ProviderFactory.create(name="p1", kind="openai", base_url="http://127.0.0.1:9/v1")
    agent: Agent = AgentFactory.create(name="ada", provider=provider, model="m1")
    history_append(agent=agent, participant="alice", role=HistoryRow.Role.USER, content="hi")
    return api_token_create(name=f"fuzz-{request.param}", operator=request.param == "operator")[1]


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_no_operation_answers_a_5xx_or_outside_the_document(case: Any, token: str) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)
