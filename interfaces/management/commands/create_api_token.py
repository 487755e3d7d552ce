from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.models import DEFAULT_PROJECT
from agentops.tokens import api_token_create
from agentops.validation import text_problem


class Command(BaseCommand):
    help = "Create an API token and print it once (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who or what the token is for")
        parser.add_argument(
            "--operator",
            action="store_true",
            help="allow operator endpoints and every project's agents",
        )
        parser.add_argument(
            "--project",
            default=DEFAULT_PROJECT,
            help=(
                "the project whose agents the token sees and acts on "
                "(created if new; default: %(default)s)"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        problem = text_problem(options["name"], line=True) or text_problem(
            options["project"], line=True
        )
        if problem or not options["name"].strip() or not options["project"].strip():
            raise CommandError(
                f"name and --project must be non-empty one-line text: {problem or 'empty'}"
            )
        _, token = api_token_create(
            name=options["name"][:100],
            operator=options["operator"],
            project=options["project"][:100],
        )
        self.stdout.write(token)
