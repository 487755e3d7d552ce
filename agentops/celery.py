"""The Celery application shared by workers, beat and the web process (which only enqueues)."""

import os

from celery import Celery
from celery.result import AsyncResult
from celery.signals import (
    beat_init,
    celeryd_init,
    setup_logging,
    task_postrun,
    task_prerun,
)
from opentelemetry import context as otel_context
from opentelemetry import propagate

from . import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")

app = Celery("agentops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def task_countdown_s(delay_s: float) -> float:
    """``delay_s`` as a task's countdown: at most half the broker's visibility timeout, because
    Redis hands a task not acknowledged within that timeout to a second worker, and a task held
    for its countdown is not acknowledged. A caller with a longer wait keeps the due time on its
    row, and a beat sweep sends the task when it is due."""
    from django.conf import settings

    return min(delay_s, settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] / 2)


def task_send(name: str, *args: object, countdown_s: float = 0.0) -> None:
    """Send the task ``name`` (its registered name, e.g. ``inference.tasks.agent_drain``) with
    ``args``, after ``countdown_s`` capped by ``task_countdown_s``. Services enqueue work by name,
    so none imports a ``tasks`` module (the tasks import the services). Call it on commit."""
    countdown = task_countdown_s(countdown_s) if countdown_s > 0 else None
    # The sender's trace context goes with the task (W3C headers): the worker's task runs
    # under it (``_task_traced``).
    headers = _trace_headers() if telemetry.enabled else None
    # No result is kept (CELERY_TASK_IGNORE_RESULT, no result backend) or returned: without these
    # two, every send builds the thread's result backend (a web request runs in a thread of its
    # own) and an AsyncResult nobody reads. A task that had to keep its result would need a
    # sender of its own: ignore_result here overrides the task's own setting.
    app.send_task(
        name,
        args=args,
        countdown=countdown,
        ignore_result=True,
        result_cls=_Unread,
        headers=headers,
    )


def _trace_headers() -> dict[str, str] | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


@task_prerun.connect
def _task_traced(task_id: str = "", task: object = None, **kwargs: object) -> None:
    if not telemetry.enabled:
        return
    request = getattr(task, "request", None)
    carrier = {
        name: value
        for name in propagate.get_global_textmap().fields
        if isinstance(value := getattr(request, name, None), str)
    }
    if carrier and request is not None:
        # Kept on the task's own request, which Celery pops after ``task_postrun``.
        request.agentops_context = otel_context.attach(propagate.extract(carrier))


@task_postrun.connect
def _task_untraced(task_id: str = "", task: object = None, **kwargs: object) -> None:
    request = getattr(task, "request", None)
    token = getattr(request, "agentops_context", None)
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]


class _Unread(AsyncResult):  # type: ignore[type-arg]
    """What ``send_task`` returns here: nothing to read, so no backend to look up."""

    def __init__(self, task_id: str) -> None:
        self.id = task_id


@setup_logging.connect
def _logging_as_configured(**kwargs: object) -> None:
    """Workers and beat log through ``settings.LOGGING`` as the web process does (Django set it
    up), not Celery's own format: every line names its process and, under a span, its trace.
    ``AGENTOPS_LOG_LEVEL`` sets the level (``-l`` does not)."""


@celeryd_init.connect
def _on_celeryd_init(sender: object = None, **kwargs: object) -> None:
    """The worker's name (``-n``), known before Django's setup: on its log lines, its leases
    and its telemetry."""
    telemetry.telemetry_setup(role="worker", worker=str(sender or ""))


@beat_init.connect
def _on_beat_init(**kwargs: object) -> None:
    telemetry.telemetry_setup(role="beat")
