"""The bare baseline of ``bench/turns_bench.py``: a Celery task that makes one direct call to
the stand-in and records when it started and ended, nothing else (no Django, no database).

Its worker is started by the bench with the service's own Celery settings (pool, concurrency,
prefetch, acknowledgement, broker), handed over as JSON in ``TBENCH_CELERY_CONF``; only the
queue is its own, so its tasks never mix with the service's worker.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import httpx
import redis
from celery import Celery

app = Celery("tbench_bare")
app.conf.update(json.loads(os.environ.get("TBENCH_CELERY_CONF", "{}")))

# A client per pool thread, its connection kept alive between tasks (the service keeps its
# connections alive too: the agentops runtime, pooled clients). One client shared by hundreds
# of threads would measure httpcore's pool lock, not the call.
_local = threading.local()
_redis: dict[str, redis.Redis] = {}


def http_client() -> httpx.Client:
    """This pool thread's client (the ORM baseline's task uses it too)."""
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client(timeout=httpx.Timeout(60, connect=5))
    return client


def results_redis(broker_url: str) -> redis.Redis:
    """The Redis the tasks push their timings onto (the broker's)."""
    client = _redis.get(broker_url)
    if client is None:
        client = _redis[broker_url] = redis.Redis.from_url(broker_url)
    return client


@app.task(name="tbench.bare_call")
def bare_call(
    key: str, index: int, url: str, headers: dict[str, str], body: dict[str, Any]
) -> None:
    """POST ``body`` to ``url`` and read the answer to its end (every SSE line when streamed),
    then push ``{index, started, ended, status}`` (unix seconds) onto the Redis list ``key``."""
    started = time.time()
    if body.get("stream"):
        with http_client().stream("POST", url, headers=headers, json=body) as response:
            for _ in response.iter_lines():
                pass
            status = response.status_code
    else:
        response = http_client().post(url, headers=headers, json=body)
        response.json()
        status = response.status_code
    ended = time.time()
    results_redis(str(app.conf.broker_url)).rpush(
        key, json.dumps({"index": index, "started": started, "ended": ended, "status": status})
    )
