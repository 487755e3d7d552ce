"""A worker's collector (``agentops.collector``): young collections come by time as well as by
count, what survives one is frozen, so older collections no longer walk a worker's thousands of
held streams, and a sweep frees the cycles that were frozen. In a process of its own: the
suite's collector is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import gc, json, time, weakref
from agentops import collector

collector.quiet(3600)
before = gc.get_freeze_count()


class Node:
    pass


kept = [Node() for _ in range(20_000)]  # live past a young collection
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle that outlives a young collection, then is dropped
cycle = weakref.ref(a)
# The worker's young collections come by time (20,000 objects are too few to count): time has
# to pass, polled for what it brings, within 10 s.
for _ in range(100):
    time.sleep(0.1)
    if gc.get_freeze_count() - before >= 20_000:
        break
frozen = gc.get_freeze_count() - before
del a, b
gc.collect(0)
gc.collect(1)
gc.collect(2)
kept_by_collections = cycle() is not None
looked_at, found, took_ms = collector.sweep()  # looked_at: the objects that were frozen
print(json.dumps({
    "frozen": frozen,
    "threshold": gc.get_threshold()[0],
    "kept_by_collections": kept_by_collections,
    "freed_by_sweep": cycle() is None,
    "found": found,
    "looked_at": looked_at,
    "frozen_after_sweep": gc.get_freeze_count() >= 20_000,
}))
"""


def test_survivors_of_a_young_collection_are_frozen_and_a_sweep_frees_their_cycles() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(out.stdout)
    assert seen["threshold"] == 50_000
    assert seen["frozen"] >= 20_000  # a young collection came, and its survivors were frozen
    # The price: a cycle frozen before it was dropped is not freed by any collection...
    assert seen["kept_by_collections"] is True
    # ...until a sweep, which looks at everything and leaves it frozen again.
    assert seen["freed_by_sweep"] is True and seen["found"] >= 2
    assert seen["looked_at"] >= 20_000 and seen["frozen_after_sweep"] is True
