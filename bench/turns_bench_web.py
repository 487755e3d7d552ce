"""The web half of the ORM baseline of ``bench/turns_bench.py``: what a user would write to take
turns over HTTP in front of the ORM task (``bench/turns_bench_orm.py``), so the API burst has a
baseline that pays an intake too.

One plain Django view, ``POST /api/v1/agents/<name>/turns`` (the service's path, so the bench
submits to both alike): the bearer token looked up in the service's API token table by its
sha256, as the service stores it; the agent looked up and locked; the user's messages appended
to its history, a queued turn and its trigger links created in one transaction; the ORM task
sent with ``delay`` on commit; 202 with the turn's id. Only the ORM on the service's models, no
hand-written SQL and none of the service's code but its settings; Django's own ASGI handler and
the middleware ``startproject`` writes. Unlike the service it never joins a turn already queued
(each agent of a burst gets one turn, so the service joins none either).

Served by ``uvicorn bench.turns_bench_web:application`` with the service's web app's options.
From the environment: the ORM worker's Celery settings (``TBENCH_CELERY_CONF``: its queue),
the wire requests the service's worker sent (``TBENCH_WIRES``, by the agent's ``stream``: the
task's call, as in the ORM burst) and the Redis list the task pushes its timings onto
(``TBENCH_RESULTS_KEY``).
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import partial

import django
from django.conf import settings

from agentops import settings as service_settings

# The service's settings (database and its pool, apps, time zone), with this module as the
# URLconf and the middleware of a new Django project.
settings.configure(
    **{
        **{name: value for name, value in vars(service_settings).items() if name.isupper()},
        "ROOT_URLCONF": __name__,
        "MIDDLEWARE": [
            "django.middleware.security.SecurityMiddleware",
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
            "django.middleware.clickjacking.XFrameOptionsMiddleware",
        ],
    }
)
django.setup(set_prefix=False)

from django.core.asgi import get_asgi_application  # noqa: E402  (after the setup)
from django.db import transaction  # noqa: E402
from django.db.models import Max  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402

from agentops.models import Agent, ApiToken, HistoryRow  # noqa: E402
from bench.turns_bench_orm import orm_turn  # noqa: E402
from inference.models import Turn  # noqa: E402

WIRES = {
    stream == "streamed": wire for stream, wire in json.loads(os.environ["TBENCH_WIRES"]).items()
}
RESULTS_KEY = os.environ["TBENCH_RESULTS_KEY"]


@csrf_exempt
@require_POST
def submit_turn(request: HttpRequest, name: str) -> JsonResponse:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    api_token = ApiToken.objects.filter(
        token_hash=hashlib.sha256(token.encode()).hexdigest(), revoked_at=None
    ).first()
    if scheme.lower() != "bearer" or api_token is None:
        return JsonResponse({"detail": "unknown token"}, status=401)
    try:
        messages = json.loads(request.body)["messages"]
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": "the body is JSON with messages"}, status=400)
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(name=name, disposed_at=None).first()
        if agent is None or not (api_token.operator or agent.project_id == api_token.project_id):
            return JsonResponse({"detail": "agent not found"}, status=404)
        last = HistoryRow.objects.filter(agent=agent).aggregate(last=Max("seq"))["last"] or 0
        added = HistoryRow.objects.bulk_create(
            [
                HistoryRow(
                    agent=agent,
                    seq=last + i,
                    participant=message["participant"],
                    role=HistoryRow.Role.USER,
                    content=message["content"],
                )
                for i, message in enumerate(messages, start=1)
            ]
        )
        turn = Turn.objects.create(agent=agent, status=Turn.Status.QUEUED)
        turn.trigger_rows.add(*added)
        wire = WIRES[agent.stream]
        transaction.on_commit(
            partial(
                orm_turn.delay,
                RESULTS_KEY,
                turn.pk,
                turn.pk,
                wire["url"],
                wire["headers"],
                wire["body"],
            )
        )
    return JsonResponse({"id": turn.pk, "status": turn.status}, status=202)


urlpatterns = [path("api/v1/agents/<str:name>/turns", submit_turn)]

application = get_asgi_application()
