"""Give the live dashboard something to show: real turns, on demo agents scripted on the
stand-in provider, run by the workers of `make run` (run `seed_demo` first; `make run` does).

Not for a production database: it adds agents named ``live-*`` and their turns."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.models import Agent, Provider
from inference.models import Turn
from turns.services import IncomingMessage, turn_submit

# name, provider, stand-in scenario (the model), stream: what each shows on the dashboard.
LIVE_AGENTS = [
    # a long answer: passes its before-content deadline, then counts down to its absolute one
    ("live-writer", "standin-anthropic", "answer:chunks=60,interval_ms=2000", True),
    # keepalives only: counts down to its before-content deadline and is cut
    ("live-stalled", "standin-openai", "pings:interval_ms=500", True),
    # a slow unstreamed answer: counts down to its whole-call deadline
    ("live-unstreamed", "standin-openai", "answer:delay_ms=40000", False),
    # a 429 stating a 2 hour wait (longer than AGENTOPS_WAIT_ALERT_MS, 1 h): a hold counting
    # down, and its provider-wait alert
    ("live-held", "standin-openai", "rate-limit:form=retry-after-ms,wait_ms=7200000", True),
    # refused every time: the streak climbs to hard-down, the probe is refused too
    ("live-refused", "standin-anthropic", "refuse", True),
]
REFUSALS = 3  # the breaker's default threshold


class Command(BaseCommand):
    help = (
        "Run demo turns that fill the live dashboard (/dashboard/) "
        "with calls, holds, a breaker and alerts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--timeout",
            type=float,
            default=60.0,
            help="seconds to wait for each refused turn to end",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        providers = {
            p.name: p for p in Provider.objects.filter(name__in={a[1] for a in LIVE_AGENTS})
        }
        if len(providers) < 2:
            raise CommandError(
                "no stand-in providers: run `make run` (or manage.py seed_demo) first"
            )
        agents = {}
        for name, provider, model, stream in LIVE_AGENTS:
            agents[name], _ = Agent.objects.update_or_create(
                name=name,
                defaults={
                    "provider": providers[provider],
                    "model": model,
                    "stream": stream,
                    "participant": name,
                    "max_tokens": 1024,
                    "disposed_at": None,
                },
            )
        # One refused turn after another (a turn sent while one is queued would join it).
        for i in range(REFUSALS):
            turn, _ = turn_submit(
                agent_id=agents["live-refused"].pk,
                messages=[IncomingMessage("alice", f"message {i + 1}")],
            )
            end = time.monotonic() + options["timeout"]
            while Turn.objects.filter(pk=turn.pk, status__in=Turn.OPEN).exists():
                if time.monotonic() > end:
                    raise CommandError(
                        f"turn {turn.pk} of live-refused did not end: are the workers running?"
                    )
                time.sleep(0.2)
            time.sleep(1.0)  # let the breaker finish with it (and its probe) before the next
            self.stdout.write(f"live-refused: turn {turn.pk} ended")
        # Then the long calls (`make run`'s worker runs two turns at once: the third waits).
        for name in ("live-held", "live-writer", "live-stalled", "live-unstreamed"):
            turn, _ = turn_submit(
                agent_id=agents[name].pk, messages=[IncomingMessage("alice", f"Hello {name}")]
            )
            self.stdout.write(f"{name}: turn {turn.pk} queued")
        self.stdout.write("open /dashboard/ (signed in as staff) to watch them")
