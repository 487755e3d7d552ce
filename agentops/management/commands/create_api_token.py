from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agentops.tokens import api_token_create


class Command(BaseCommand):
    help = "Create an API token and print it once (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who or what the token is for")
        parser.add_argument("--operator", action="store_true", help="allow operator endpoints")

    def handle(self, *args: Any, **options: Any) -> None:
        _, token = api_token_create(name=options["name"][:100], operator=options["operator"])
        self.stdout.write(token)
