"""The cyclic garbage collector in a worker process: kept from stalling the loop that times the
cuts (``quiet``), and swept now and then for what it no longer looks at (``sweep``).

What exists once a worker is ready is frozen first, and so is whatever survives a young
collection: a worker holds thousands of streams whose objects live for minutes, and each older
collection walked them all again, stopping the loop (and every cut due meanwhile). Young
collections run by time from a thread of their own, since CPython's allocation count hardly
grows in a storm of cuts. The measurements behind each choice: docs/performance.md ("The
collector").

The cost: a cycle made of objects that lived past one young collection stays until the next
sweep. A call leaves none (``tests/calls/test_call_garbage.py``), and each sweep logs
what it freed, so a leak shows.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

# Young objects between cyclic collections by count (CPython's default is 700), and how often
# they are collected in any case.
GEN0_THRESHOLD = 50_000
YOUNG_EVERY_S = 0.1


def quiet(sweep_every_s: float) -> None:
    """In a worker once it is ready: what exists now lives as long as the process, and what
    survives a young collection from now on is frozen; a thread collects the young objects
    every ``YOUNG_EVERY_S`` and sweeps every ``sweep_every_s``."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
        threading.Thread(
            target=_collecting, args=(sweep_every_s,), name="agentops-collector", daemon=True
        ).start()


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop":
        gc.freeze()


def sweep() -> tuple[int, int, float]:
    """One full collection over everything, frozen or not (the process stops for it: seconds
    with thousands of streams held). The objects that were frozen, the unreachable
    ones it found and the milliseconds it took."""
    started = time.perf_counter()
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()  # (the callback froze the survivors already, where ``quiet`` installed it)
    return frozen, found, (time.perf_counter() - started) * 1000


def _collecting(sweep_every_s: float) -> None:
    swept = time.monotonic()
    while True:
        time.sleep(YOUNG_EVERY_S)
        if time.monotonic() - swept < sweep_every_s:
            gc.collect(0)
        else:
            frozen, found, took_ms = sweep()
            swept = time.monotonic()
            logger.info(
                "collector sweep: %d objects, %d unreachable freed, "
                "the process stopped for %.0f ms",
                frozen,
                found,
                took_ms,
            )
