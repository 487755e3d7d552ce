"""factory-boy factories for the core records."""

from __future__ import annotations

import factory

from agentops.models import Agent, Alert, HistoryRow, Provider
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
