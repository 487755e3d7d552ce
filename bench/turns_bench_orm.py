"""The ORM baseline of ``bench/turns_bench.py``: what a user would write instead of the service,
a Celery task that runs one queued turn with the Django ORM and makes the same direct call to
the stand-in as the bare task (``bench/turns_bench_bare.py``).

It writes the rows the service writes for a short turn, with nothing but the ORM on the
service's models (no hand-written SQL, none of the service's own code): it takes the agent's
lease, marks the turn running, creates the call row before the call and completes it after,
appends the answer to the agent's history, marks the turn succeeded and lets the lease go.
The queued turns (a user message in the history, the turn, its trigger link) are created
before the ORM burst by the bench, or one by one by the ORM view (``bench/turns_bench_web.py``);
each task gets a turn id and the wire request the service sent.

Its worker is started by the bench as the bare worker is, with the service's Celery settings
in ``TBENCH_CELERY_CONF`` and a queue of its own, and with Django set up on the bench
database (``DJANGO_SETTINGS_MODULE``, ``DATABASE_URL``): the same connection pool as the
service's worker.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from typing import Any

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
django.setup()  # before the app below, so that it is Celery's current app

from django.conf import settings  # noqa: E402  (after the setup)
from django.db import transaction  # noqa: E402
from django.db.models import Max  # noqa: E402
from django.utils import timezone  # noqa: E402

from agentops.models import Agent, HistoryRow  # noqa: E402
from bench.turns_bench_bare import http_client, results_redis  # noqa: E402  (as the bare task: a client per pool thread)
from inference.models import AgentLease, InferenceCall, Turn  # noqa: E402

app = Celery("tbench_orm")
app.conf.update(json.loads(os.environ.get("TBENCH_CELERY_CONF", "{}")))


def _call(
    url: str, headers: dict[str, str], body: dict[str, Any]
) -> tuple[int, str, str, dict[str, Any]]:
    """The bare task's call, its answer read as a user must to store it (OpenAI chat
    completions, streamed or not): (status, text, finish reason, usage)."""
    text: list[str] = []
    stop = ""
    usage: dict[str, Any] = {}
    if body.get("stream"):
        with http_client().stream("POST", url, headers=headers, json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data:"))
                for choice in chunk.get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
                    stop = choice.get("finish_reason") or stop
                usage = chunk.get("usage") or usage
            status = response.status_code
    else:
        response = http_client().post(url, headers=headers, json=body)
        status = response.status_code
        answer = response.json()
        if status == 200:
            choice = answer["choices"][0]
            text.append(choice["message"].get("content") or "")
            stop = choice.get("finish_reason") or ""
            usage = answer.get("usage") or {}
    return status, "".join(text), stop, usage


@app.task(name="tbench.orm_turn")
def orm_turn(
    key: str, index: int, turn_id: int, url: str, headers: dict[str, str], body: dict[str, Any]
) -> None:
    """Run the queued turn ``turn_id`` (its call: ``body`` POSTed to ``url``) and record its
    rows with the ORM, then push ``{index, started, ended, status}`` (unix seconds) onto the
    Redis list ``key``, as the bare task does."""
    started = time.time()
    owner = f"{orm_turn.request.hostname}:{threading.get_ident()}"
    turn = Turn.objects.select_related("agent").get(pk=turn_id)
    agent = turn.agent
    # The agent's lease: one turn at a time per agent (its primary key is the agent).
    AgentLease.objects.create(
        agent=agent,
        owner=owner,
        until=timezone.now() + timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_MS),
    )
    try:
        turn.status = Turn.Status.RUNNING
        turn.started_at = timezone.now()
        turn.claimed_by = owner
        turn.attempts += 1
        turn.save(update_fields=["status", "started_at", "claimed_by", "attempts"])
        call = InferenceCall.objects.create(
            turn=turn,
            agent=agent,
            kind=InferenceCall.Kind.PRIMARY,
            model=body["model"],
            streamed=bool(body.get("stream")),
            max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
            sent_at=timezone.now(),
        )
        status, text, stop, usage = _call(url, headers, body)
        ok = status == 200
        call.ended_at = timezone.now()
        call.outcome = InferenceCall.Outcome.COMPLETED if ok else InferenceCall.Outcome.ERROR
        call.stop_reason = stop[:50]
        call.input_tokens = usage.get("prompt_tokens")
        call.output_tokens = usage.get("completion_tokens")
        call.error = None if ok else {"status": status}
        call.save(
            update_fields=[
                "ended_at",
                "outcome",
                "stop_reason",
                "input_tokens",
                "output_tokens",
                "error",
            ]
        )
        with transaction.atomic():
            # The agent's row locked while the answer takes the next sequence number (a
            # submit appending the user's messages meanwhile takes it after).
            Agent.objects.select_for_update().only("id").get(pk=agent.pk)
            if ok:
                seq = (
                    HistoryRow.objects.filter(agent=agent).aggregate(last=Max("seq"))["last"] or 0
                ) + 1
                HistoryRow.objects.create(
                    agent=agent,
                    seq=seq,
                    participant=agent.participant,
                    role=HistoryRow.Role.ASSISTANT,
                    content=[{"type": "text", "text": text}],
                )
            turn.status = Turn.Status.SUCCEEDED if ok else Turn.Status.FAILED
            turn.output = {"content": text, "stop_reason": stop, "tool_calls": []} if ok else None
            turn.error = None if ok else {"status": status}
            turn.rounds = 1
            turn.ended_at = timezone.now()
            turn.save(update_fields=["status", "output", "error", "rounds", "ended_at"])
    finally:
        AgentLease.objects.filter(agent=agent, owner=owner).delete()
    ended = time.time()
    results_redis(str(app.conf.broker_url)).rpush(
        key, json.dumps({"index": index, "started": started, "ended": ended, "status": status})
    )
