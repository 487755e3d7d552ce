"""A worker's runtime, with the worker's lifetime (architecture.md §2, "The runtime"): built and
started at ``worker_init``, before the worker takes a task; its warm shutdown begun when the
worker's begins (a waiting turn is handed back at once, no new run is taken); once the task
pool stopped, its runs waited for and the runtime stopped (its live events sent, its provider
connections closed), then the telemetry flushed."""

from __future__ import annotations

from celery.signals import worker_init, worker_shutdown, worker_shutting_down

from agentops import telemetry
from agentops.runtime import install
from turns.drain import WorkerRuntime


@worker_init.connect
def _worker_runtime_built(**kwargs: object) -> None:
    made = WorkerRuntime()
    made.start()
    install(made)

    def shutting_down(**kwargs: object) -> None:
        made.begin_shutdown()

    def shut_down(**kwargs: object) -> None:
        # A remote shutdown (celery control) sends no worker_shutting_down: begin it here too.
        made.begin_shutdown()
        made.wait_idle()
        made.stop()
        install(None)
        telemetry.telemetry_flush()

    # Held strongly (``weak=False``): nothing else refers to these closures.
    worker_shutting_down.connect(shutting_down, weak=False)
    worker_shutdown.connect(shut_down, weak=False)
