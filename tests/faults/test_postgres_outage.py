"""PostgreSQL stopped and started under a live worker (issue 12, tests 1, 2, 3 and 5).

Each test stops the throwaway cluster while a call is out, so the call's answer arrives while
the database is down, and starts it again; the stand-in's record tells which calls reached the
provider, and when."""

from __future__ import annotations

import json
import signal
import time

from tests.conftest import wait_for

from .conftest import FAULT_ENV, FaultStack, provider_calls, submit, wait_turn

# How long the database stays down in these tests: longer than the answers take to arrive,
# and longer than the lease (8 s), as in the outages that lost waits.
DOWN_S = 9.0
LEASE_S = int(FAULT_ENV["AGENTOPS_TURN_LEASE_MS"]) / 1000


def test_a_stated_wait_while_postgres_is_down_is_held_at_once_and_lands_in_the_journal_after_recovery(
    faults: FaultStack, standin: str
) -> None:
    faults.start_worker("w1")
    model = "error:status=429,form=retry-after,wait_ms=7200000,delay_ms=2000,message=outage-one"
    turn = submit(faults, "outage-one", model)
    wait_for(lambda: provider_calls(standin, model), what="the call to go out")
    faults.stop_postgres()  # the 429 (retry-after: 7200) arrives about 2 s later
    answered_at = provider_calls(standin, model)[0]["received_at"] + 2.0
    time.sleep(
        DOWN_S
    )  # the outage itself: the 429 arrives while PostgreSQL is down (DOWN_S: see above)
    faults.start_postgres()
    back = time.monotonic()
    rows = wait_for(
        lambda: faults.sql(
            "SELECT * FROM waits_waitjournalentry WHERE kind = 'set' AND agent = %s", "outage-one"
        ),
        timeout=15,
        what="the stated wait to land in the journal",
    )
    print(
        f"measure 1: the stated wait landed in the journal {time.monotonic() - back:.2f} s "
        "after PostgreSQL was back"
    )
    assert len(rows) == 1
    # Decided when the answer arrived, not when the database came back.
    assert abs(rows[0]["until_ms"] / 1000 - (answered_at + 7200)) < 3
    held = wait_turn(faults, turn, ("held",), timeout=15)
    assert held["hold_until"] is not None and held["hold_until"].timestamp() > time.time() + 7000
    # Nothing calls the provider before the wait's end. The run's lease lapsed while PostgreSQL
    # was down (DOWN_S > LEASE_S); each re-check since (the sweep's, the turn's own) writes the
    # turn's hold again, or would have claimed it and called before holding it again. Held
    # after two such writes: any call a re-check made has reached the provider.
    rechecked(faults, turn, 2)
    assert len(provider_calls(standin, model)) == 1
    print(f"measure 1: provider calls {len(provider_calls(standin, model))}")
    assert (
        faults.sql("SELECT status FROM inference_turn WHERE id = %s", turn)[0]["status"] == "held"
    )


def rechecked(faults: FaultStack, turn: int, times: int) -> None:
    """Return once the turn's row has been written ``times`` times from now (a held turn's
    re-check writes its hold again, with the same values: a new row version) and it is held:
    a re-check that claimed it (a write) holds it again only after its call."""
    query = "SELECT xmin::text AS version, status FROM inference_turn WHERE id = %s"
    versions = [faults.sql(query, turn)[0]["version"]]

    def done() -> bool:
        (now,) = faults.sql(query, turn)
        if now["version"] != versions[-1]:
            versions.append(now["version"])
        return len(versions) > times and now["status"] == "held"

    wait_for(done, timeout=LEASE_S + 15, what=f"the held turn to be re-checked {times} times")


def answers_out_through_an_outage(
    faults: FaultStack, standin: str, prefix: str, *, count: int, delay_ms: int
) -> tuple[list[str], list[int]]:
    """A worker's ``count`` turns whose answers take ``delay_ms``: once every call is out,
    PostgreSQL stops for ``DOWN_S`` and starts again. Returns the models and the turns."""
    faults.start_worker("w1")
    models = [f"answer:delay_ms={delay_ms},text={prefix}-{i}" for i in range(count)]
    turns = [submit(faults, f"{prefix}-{i}", model) for i, model in enumerate(models)]
    wait_for(lambda: all(provider_calls(standin, m) for m in models), what="the calls to go out")
    faults.stop_postgres()
    time.sleep(
        DOWN_S
    )  # the outage itself: the answers arrive while PostgreSQL is down (DOWN_S: see above)
    faults.start_postgres()
    return models, turns


def test_an_answer_received_while_postgres_is_down_is_stored_after_recovery_with_one_call(
    faults: FaultStack, standin: str
) -> None:
    models, turns = answers_out_through_an_outage(
        faults, standin, "outage-two", count=2, delay_ms=2000
    )
    back = time.monotonic()
    for i, turn in enumerate(turns):
        done = wait_turn(faults, turn, ("succeeded", "failed", "exhausted"), timeout=30)
        assert done["status"] == "succeeded"
        assert done["output"]["content"] == f"outage-two-{i}"
    print(
        f"measure 2: both answers stored {time.monotonic() - back:.2f} s after PostgreSQL was back"
    )
    # Every run over the two agents has ended (no lease left): a takeover of a lapsed lease
    # would have called within its run, and a run begun now finds both turns ended.
    wait_for(
        lambda: (
            not faults.sql(
                "SELECT 1 FROM inference_agentlease l JOIN inference_turn t USING (agent_id) "
                "WHERE t.id = ANY(%s)",
                turns,
            )
        ),
        timeout=LEASE_S + 10,
        what="every run over the turns to end",
    )
    assert [len(provider_calls(standin, m)) for m in models] == [1, 1]
    print("measure 2: provider calls 2 for 2 turns")
    calls = faults.sql(
        "SELECT turn_id, outcome FROM inference_inferencecall WHERE turn_id = ANY(%s) ORDER BY id",
        turns,
    )
    assert sorted((c["turn_id"], c["outcome"]) for c in calls) == [
        (t, "completed") for t in sorted(turns)
    ]


def test_a_warm_shutdown_during_a_429_pacing_wait_keeps_the_pacing(
    faults: FaultStack, standin: str
) -> None:
    floor_s = 8.0
    pacing = {"AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS": str(int(floor_s * 1000))}
    faults.start_worker("w1", pacing)
    model = "error:status=429,form=none,times=1,message=outage-three"
    turn = submit(faults, "outage-three", model)
    wait_for(
        lambda: faults.sql(
            "SELECT 1 FROM inference_inferencecall WHERE turn_id = %s AND outcome = 'error'", turn
        ),
        what="the 429 to be recorded",
    )
    # The shutdown comes during the 8 s pacing, once the worker has kept it on the turn, not
    # as the call ends.
    wait_for(
        lambda: faults.sql(
            "SELECT 1 FROM inference_turn WHERE id = %s AND not_before IS NOT NULL", turn
        ),
        what="the 429's pacing to be kept on the turn",
    )
    first = provider_calls(standin, model)[0]["received_at"]
    faults.stop_process("w1", signal.SIGTERM)  # warm shutdown: the turn is handed back
    faults.start_worker("w2", pacing)
    done = wait_turn(faults, turn, ("succeeded", "failed", "exhausted"), timeout=40)
    assert done["status"] == "succeeded"
    calls = provider_calls(standin, model)
    assert len(calls) == 2
    print(
        f"measure 3: next call {calls[1]['received_at'] - first:.2f} s after the 429 "
        f"(floor {floor_s:g} s)"
    )
    assert calls[1]["received_at"] - first >= floor_s, (
        "the next worker called before the 429's pacing floor"
    )


def test_after_recovery_the_live_workers_turns_resume_within_two_seconds(
    faults: FaultStack, standin: str
) -> None:
    models, turns = answers_out_through_an_outage(
        faults, standin, "outage-five", count=3, delay_ms=1500
    )
    back = time.monotonic()
    for turn in turns:
        wait_turn(faults, turn, ("succeeded",), timeout=30)
    recovered_s = time.monotonic() - back
    print(f"measure 5: turns resumed {recovered_s:.2f} s after PostgreSQL was back")
    assert recovered_s < 2.0
    assert [len(provider_calls(standin, m)) for m in models] == [1, 1, 1]


def test_a_worker_killed_during_a_429_pacing_wait_leaves_the_pacing_to_the_worker_that_takes_the_turn_over(
    faults: FaultStack, standin: str
) -> None:
    floor_s = 20.0  # longer than the lease (8 s) and its grace (3 s): the takeover comes first
    pacing = {"AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS": str(int(floor_s * 1000))}
    faults.start_worker("w1", pacing)
    model = "error:status=429,form=none,times=1,message=outage-three-kill"
    turn = submit(faults, "outage-three-kill", model)
    wait_for(
        lambda: faults.sql(
            "SELECT 1 FROM inference_turn WHERE id = %s AND not_before IS NOT NULL", turn
        ),
        what="the 429's pacing to be kept on the turn",
    )
    first = provider_calls(standin, model)[0]["received_at"]
    faults.stop_process("w1", signal.SIGKILL)  # the turn stays running under a lease nobody renews
    faults.start_worker("w2", pacing)
    done = wait_turn(faults, turn, ("succeeded", "failed", "exhausted"), timeout=60)
    assert done["status"] == "succeeded"
    calls = provider_calls(standin, model)
    assert len(calls) == 2
    print(
        f"measure 3: after a kill -9, next call {calls[1]['received_at'] - first:.2f} s "
        f"after the 429 (floor {floor_s:g} s)"
    )
    assert calls[1]["received_at"] - first >= floor_s, (
        "the worker that took the turn over called before the 429's pacing floor"
    )


# Run in a fresh process of the fault stack (``manage.py shell``) while its PostgreSQL is down:
# a turn's live event published outside a transaction, as a run does right after it records a
# call's end, and what a listener of the turn's group then receives.
LIVE_EVENT_WHILE_DOWN = """
import asyncio, json
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from agentops.live import broadcast_turn_event, turn_group

def send():
    try:
        broadcast_turn_event(
            TURN, {"type": "call.ended", "turn": TURN, "call": 1, "outcome": "completed"}
        )
        return "published"
    except Exception as exc:
        return type(exc).__name__

async def main():
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(turn_group(TURN), channel)
    outcome = await sync_to_async(send)()  # in a thread, as a run's bookkeeping sends it
    received = None
    if outcome == "published":
        received = (await asyncio.wait_for(layer.receive(channel), 10))["event"]
    print(json.dumps({"outcome": outcome, "received": received}))

asyncio.run(main())
"""


def test_a_turns_live_event_outside_a_transaction_needs_no_database(faults: FaultStack) -> None:
    """A run records a call's end durably (retried until the database answers), then sends the
    turn's ``call.ended``. If PostgreSQL goes away between the two, the send must not ask the
    database anything (Django's ``on_commit`` outside a transaction connects to ask whether
    autocommit is on): the run would take that failure for its bookkeeping's, and run the
    turn again from the top, calling the provider a second time for an answer it stored."""
    faults.stop_postgres()
    out = faults.manage("shell", "-c", LIVE_EVENT_WHILE_DOWN.replace("TURN", "424242"))
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["outcome"] == "published", (
        f"sending the live event raised {seen['outcome']} with PostgreSQL down"
    )
    assert seen["received"] == {
        "type": "call.ended",
        "turn": 424242,
        "call": 1,
        "outcome": "completed",
    }
