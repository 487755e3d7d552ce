"""``python manage.py release_wait AGENT [--model M] [--requester R] --reason TEXT``
(architecture.md §6.8).

The same release service as the API and the admin. A refused release exits non-zero with the
service's message and changes nothing. This process ends with the command, so a release it
could not record is not left pending: the command says so and exits non-zero.
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.exceptions import AgentopsError
from turns.holds import next_call_at
from turns.queue import held_turns_wake  # an interface may wake turns
from waits.journal import journal_pending
from waits.services import wait_release


class Command(BaseCommand):
    help = "Release an agent's provider wait for one model (--model) or for every model."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", help="the agent's name")
        parser.add_argument(
            "--model", default=None, help='the model to release; "*" or omitted: every model'
        )
        parser.add_argument("--requester", default=None, help="who asks (default: the OS user)")
        parser.add_argument("--reason", required=True, help="why; kept in the audit entry")

    def handle(self, *args: Any, **options: Any) -> None:
        requester = options["requester"]
        if requester is None:
            requester = _os_user()
        try:
            receipts = wait_release(
                agent=options["agent"],
                model=options["model"],
                requester=requester,
                reason=options["reason"],
                via="command",
            )
        except AgentopsError as exc:
            raise CommandError(exc.message) from None
        held_turns_wake(
            agent=options["agent"], model=options.get("model"), by=f"command:{requester}"
        )
        if journal_pending():
            raise CommandError(
                "the release could not be recorded in the provider-waits journal "
                "(the database refused the write; see the log). "
                "Nothing was released for the workers. Run the command again."
            )
        if not receipts:
            self.stdout.write(
                f"No wait was binding for {options['agent']}; the release is recorded."
            )
        for receipt in receipts:
            until = receipt.as_json()["until"] or "until released"
            next_call = next_call_at(agent=receipt.agent, model=receipt.model).isoformat()
            self.stdout.write(
                f"released {receipt.agent} model {receipt.model} (held {until}): "
                f"{receipt.release}; next call at {next_call}"
            )


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return "unknown"
