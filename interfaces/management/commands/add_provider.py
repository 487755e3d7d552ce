"""``manage.py add_provider NAME --kind K --base-url URL [--key-env VAR]``: a provider, created
as ``POST /api/v1/providers`` creates one (the same schema and checks; its key stays in the
variable)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from pydantic import ValidationError

from agentops.exceptions import AgentopsError
from agentops.models import Provider
from agentops.services import provider_create
from interfaces.api.schemas import ProviderIn


class Command(BaseCommand):
    help = (
        "Add a provider (its key is read from the environment variable --key-env names, "
        "never stored)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--kind", required=True, choices=[k.value for k in Provider.Kind])
        parser.add_argument(
            "--base-url",
            required=True,
            help="e.g. https://api.openai.com/v1, http://localhost:11434/v1",
        )
        parser.add_argument(
            "--key-env",
            default="",
            help="the environment variable that holds its key, e.g. OPENAI_API_KEY",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            given = ProviderIn(
                name=options["name"],
                kind=options["kind"],
                base_url=options["base_url"],
                api_key_env=options["key_env"] or None,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            raise CommandError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        try:
            provider = provider_create(
                name=given.name,
                kind=given.kind,
                base_url=given.base_url,
                api_key_env=given.api_key_env or "",
            )
        except AgentopsError as exc:
            raise CommandError(str(exc)) from None
        key = f", key from {provider.api_key_env}" if provider.api_key_env else ", no key"
        self.stdout.write(
            f"provider {provider.name!r} added: {provider.kind} at {provider.base_url}{key}"
        )
