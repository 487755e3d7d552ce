"""``python manage.py waits_checkpoint``: append a checkpoint of the binding waits.

A full read of the provider-waits journal (a process start) begins at the latest checkpoint,
so running this now and then (e.g. daily) keeps starts fast as the journal grows. Refused
while the records are unreadable.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from agentops.exceptions import AgentopsError
from waits.services import journal_checkpoint


class Command(BaseCommand):
    help = "Append a checkpoint of the binding provider waits to the journal."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            row_id = journal_checkpoint(by="command:waits_checkpoint")
        except AgentopsError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"checkpoint written: journal row {row_id}")
