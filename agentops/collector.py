"""The cyclic garbage collector in a worker process: kept from stalling the loop that times the
cuts (``quiet``), and swept now and then for what it no longer looks at (``sweep``).

What exists once a worker is ready (Django, the threads' stacks) lives as long as the process
and is frozen first: a full collection over it, through the weakref callbacks it ran, let the
GIL go to bookkeeping threads mid-collection and stopped the loop for 0.3-0.8 s.

A worker also holds thousands of streams whose objects live for minutes, and CPython walks
every object that survived a young collection again in each older collection: in the bounds
bench at 4,000 held streams the older collections found nothing and stopped the loop for
190-440 ms, and every cut due then was that late. So what survives a young collection is
frozen (``gc.freeze``) at once: young collections still free the young cycles, and nothing
older is walked again until a sweep.

Young collections run every ``YOUNG_EVERY_S`` from a thread of their own, not only by CPython's
count: it counts allocations less deallocations, so in the storm of cuts, where old streams'
objects die as fast as the fresh calls' are made, the count hardly grew, the young objects
piled up and the collection that came at last walked hundreds of thousands of them (50-115
ms, each followed by the run's largest lateness).

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
        threading.Thread(target=_collecting, args=(sweep_every_s,), name="agentops-collector", daemon=True).start()


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop":
        gc.freeze()


def sweep() -> tuple[int, int, float]:
    """One full collection over everything, frozen or not (the process stops for it: 1.7 s with
    10,000 streams held, in the bounds bench). The objects that were frozen, the unreachable
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
            logger.info("collector sweep: %d objects, %d unreachable freed, the process stopped for %.0f ms", frozen, found, took_ms)
