from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from agentops.models import Agent
from tests.factories import AgentFactory


@pytest.fixture
def breaker_settings() -> Any:
    with override_settings(AGENTOPS_BREAKER_THRESHOLD=3, AGENTOPS_BREAKER_SHED_CAP=3):
        yield


@pytest.fixture
def agent() -> Agent:
    agent: Agent = AgentFactory.create()
    return agent
