"""A worker's runtime, with the worker's lifetime (architecture.md §2, "The runtime"): built and
started at ``worker_init``, before the worker takes a task; once the worker is ready, its
collector quieted (``agentops.collector``) and its presence announced in Redis; its warm
shutdown begun when the worker's begins (a waiting turn is handed back at once, no new run is
taken, the announcement withdrawn); once the task pool stopped, its runs waited for and the
runtime stopped (its live events sent, its provider connections closed), then the telemetry
flushed. What each stage needs is held by the closures ``worker_init`` connects, not by the
module."""

from __future__ import annotations

import threading

import redis
from celery.signals import worker_init, worker_ready, worker_shutdown, worker_shutting_down
from django.conf import settings

from agentops import collector, telemetry
from agentops.runtime import install
from turns.drain import WorkerRuntime

# Each worker announces itself in Redis with a short TTL, so /health can count live workers
# without a broadcast round trip.
WORKER_KEY_TTL_S = 30


@worker_init.connect
def _worker_runtime_built(**kwargs: object) -> None:
    made = WorkerRuntime()
    made.start()
    install(made)
    announcing = threading.Event()  # set: the announcement stops

    def ready(sender: object = None, **kwargs: object) -> None:
        collector.quiet(settings.AGENTOPS_GC_SWEEP_MS / 1000)
        hostname = getattr(sender, "hostname", "worker")
        threading.Thread(target=_announce, args=(hostname, announcing), daemon=True).start()

    def shutting_down(**kwargs: object) -> None:
        announcing.set()
        made.begin_shutdown()

    def shut_down(**kwargs: object) -> None:
        # A remote shutdown (celery control) sends no worker_shutting_down: begin it here too.
        announcing.set()
        made.begin_shutdown()
        made.wait_idle()
        made.stop()
        install(None)
        telemetry.telemetry_flush()

    # Held strongly (``weak=False``): nothing else refers to these closures.
    worker_ready.connect(ready, weak=False)
    worker_shutting_down.connect(shutting_down, weak=False)
    worker_shutdown.connect(shut_down, weak=False)


def _announce(hostname: str, stop: threading.Event) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"agentops:worker:{hostname}"
    while not stop.is_set():
        try:
            client.set(key, "1", ex=WORKER_KEY_TTL_S)
        except redis.RedisError:
            pass  # Redis down: /health reports that on its own
        stop.wait(WORKER_KEY_TTL_S / 3)
    try:
        client.delete(key)
    except redis.RedisError:
        pass
