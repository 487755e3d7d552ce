"""factory-boy factories for the core records."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import factory
from django.conf import settings
from django.utils import timezone

from agentops import idempotency
from agentops.budget_core import period_bounds
from agentops.models import (
    Agent,
    Alert,
    ApiToken,
    Budget,
    HistoryRow,
    IdempotencyKey,
    Price,
    Project,
    Provider,
)
from agentops.webhooks.models import WebhookDelivery, WebhookEndpoint
from inference.models import InferenceCall, Turn


class ProviderFactory(factory.django.DjangoModelFactory[Provider]):
    class Meta:
        model = Provider
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"provider-{n}")
    kind = Provider.Kind.OPENAI
    base_url = "http://127.0.0.1:9/v1"


class AgentFactory(factory.django.DjangoModelFactory[Agent]):
    class Meta:
        model = Agent

    name = factory.Sequence(lambda n: f"agent-{n}")
    kind = Agent.Kind.RESIDENT
    provider = factory.SubFactory(ProviderFactory)
    model = "answer"
    participant = factory.LazyAttribute(lambda a: a.name)
    max_tokens = 256


class HistoryRowFactory(factory.django.DjangoModelFactory[HistoryRow]):
    class Meta:
        model = HistoryRow

    agent = factory.SubFactory(AgentFactory)
    seq = factory.Sequence(lambda n: n + 1)
    participant = "alice"
    role = HistoryRow.Role.USER
    content = "hello"


class TurnFactory(factory.django.DjangoModelFactory[Turn]):
    """A turn of its own agent, queued (the model's default): a test names the status it needs."""

    class Meta:
        model = Turn

    agent = factory.SubFactory(AgentFactory)


class CallFactory(factory.django.DjangoModelFactory[InferenceCall]):
    """A primary, streamed call of its own agent's model, in flight (no outcome): a test names
    the turn, kind, outcome and marks it reads."""

    class Meta:
        model = InferenceCall

    agent = factory.SubFactory(AgentFactory)
    model = factory.LazyAttribute(lambda c: c.agent.model)
    streamed = True


class AlertFactory(factory.django.DjangoModelFactory[Alert]):
    """An alert row as it stands, written without ``alert_raise``: no delivery is queued for it."""

    class Meta:
        model = Alert

    kind = "hard-down"
    agent = "ada"
    message = "down"


class WebhookEndpointFactory(factory.django.DjangoModelFactory[WebhookEndpoint]):
    class Meta:
        model = WebhookEndpoint

    url = "https://8.8.8.8/hook"


class WebhookDeliveryFactory(factory.django.DjangoModelFactory[WebhookDelivery]):
    """A delivery row written directly: no task is sent for it."""

    class Meta:
        model = WebhookDelivery

    endpoint = factory.SubFactory(WebhookEndpointFactory)
    alert = factory.SubFactory(AlertFactory)
    payload = "{}"


class ProjectFactory(factory.django.DjangoModelFactory[Project]):
    class Meta:
        model = Project
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"project-{n}")


class PriceFactory(factory.django.DjangoModelFactory[Price]):
    """A model's price on a provider, in force from a second ago: 3 in and 15 out per million
    tokens. ``cached`` adds the cached-input and reasoning prices; ``later`` starts it an hour
    from now, so the price before it still prices the calls sent now.

    Written straight to the table: a process that read this (provider, model) in the last
    ``PRICE_CACHE_S`` keeps its copy until then (``POST /prices`` forgets the web process's)."""

    class Meta:
        model = Price

    provider = factory.SubFactory(ProviderFactory)
    model = "answer"
    input_per_mtok = Decimal("3")
    output_per_mtok = Decimal("15")
    effective_from = factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1))

    class Params:
        cached = factory.Trait(
            cached_input_per_mtok=Decimal("0.3"), reasoning_per_mtok=Decimal("12.5")
        )
        later = factory.Trait(
            effective_from=factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))
        )


def _period_start(budget: Any) -> datetime:
    start, _ = period_bounds(budget.period, timezone.now(), settings.AGENTOPS_BUDGET_TIME_ZONE)
    return start


class BudgetFactory(factory.django.DjangoModelFactory[Budget]):
    """An agent's budget of 10 a day, its ledger in today's period with nothing spent or
    reserved, as ``PUT .../budget`` leaves a new one when no call ended today. Given a
    ``project`` (or ``for_project``, a new one), it is the project's instead; ``held``: spent to
    its amount and held this period, as the call that reached the amount leaves it."""

    class Meta:
        model = Budget

    # Exactly one owner: an agent of its own unless a project is given.
    agent = factory.Maybe(
        "project", yes_declaration=None, no_declaration=factory.SubFactory(AgentFactory)
    )
    project = None
    amount = Decimal("10")
    period = Budget.Period.DAY
    period_start = factory.LazyAttribute(_period_start)
    ledger = 1

    class Params:
        for_project = factory.Trait(project=factory.SubFactory(ProjectFactory))
        held = factory.Trait(
            spent=factory.SelfAttribute("amount"),
            held_period=factory.SelfAttribute("period_start"),
            held_at=factory.LazyFunction(timezone.now),
        )


class ApiTokenFactory(factory.django.DjangoModelFactory[ApiToken]):
    """A token's row; the token itself is not kept (``api_token_create`` makes one to use)."""

    class Meta:
        model = ApiToken

    name = factory.Sequence(lambda n: f"token-{n}")
    token_hash = factory.LazyFunction(lambda: hashlib.sha256(secrets.token_bytes(32)).hexdigest())
    prefix = factory.LazyAttribute(lambda t: t.token_hash[:10])
    project = factory.SubFactory(ProjectFactory)


class IdempotencyKeyFactory(factory.django.DjangoModelFactory[IdempotencyKey]):
    """A key claimed now for ``POST /api/v1/agents/{agent}/complete`` with ``body``, in flight
    (its request still calling). ``age`` backdates the claim; ``abandoned``: in flight past
    ``AGENTOPS_IDEMPOTENCY_INFLIGHT_MS`` (its web process died); ``done``: answered 200 and
    recorded, a repeat replays it; ``unreplayable``: answered, too large to record;
    ``expired``: claimed past ``AGENTOPS_IDEMPOTENCY_TTL_MS``, for the sweep."""

    class Meta:
        model = IdempotencyKey

    token = factory.SubFactory(ApiTokenFactory)
    key = factory.LazyFunction(lambda: str(uuid.uuid4()))
    agent = "ada"
    endpoint = factory.LazyAttribute(lambda k: f"POST /api/v1/agents/{k.agent}/complete")
    body_hash = factory.LazyAttribute(
        lambda k: idempotency.body_hash(endpoint=k.endpoint, body=k.body)
    )
    created_at = factory.LazyAttribute(lambda k: timezone.now() - k.age)

    class Params:
        body = b'{"messages": [{"participant": "alice", "content": "hi"}]}'
        age = timedelta(0)
        done = factory.Trait(
            status=IdempotencyKey.Status.DONE,
            answered_at=factory.LazyFunction(timezone.now),
            response_status=200,
            response_headers={"content-type": "application/json"},
            response_body=b'{"content": "Stand-in answer to: hi"}',
        )
        unreplayable = factory.Trait(
            status=IdempotencyKey.Status.UNREPLAYABLE,
            answered_at=factory.LazyFunction(timezone.now),
            response_status=200,
        )
        abandoned = factory.Trait(
            age=factory.LazyFunction(
                lambda: timedelta(seconds=settings.AGENTOPS_IDEMPOTENCY_INFLIGHT_S + 1)
            )
        )
        expired = factory.Trait(
            age=factory.LazyFunction(
                lambda: timedelta(seconds=settings.AGENTOPS_IDEMPOTENCY_TTL_S + 1)
            )
        )
