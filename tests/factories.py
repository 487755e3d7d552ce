"""factory-boy factories for the core records."""

from __future__ import annotations

import factory

from agentops.models import Agent, HistoryRow, Provider


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
