"""Every change of a turn's status goes through ``turns.services`` (STYLE §3), whose
``TRANSITIONS`` table lists the moves a turn may make."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from inference.models import Turn
from tests.factories import AgentFactory, TurnFactory
from turns.moves import turn_claim, turn_hand_back
from turns.services import TRANSITIONS, sources

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "turns" / "services.py"
S = Turn.Status


def test_an_ended_turn_never_moves_again() -> None:
    for ended in Turn.ENDED:
        assert ended not in TRANSITIONS
        assert all(ended not in sources(to) for to in S.values)


def test_every_open_status_can_be_cancelled_and_only_a_running_turn_can_end_otherwise() -> None:
    assert set(sources(S.CANCELLED)) == set(Turn.OPEN)
    for ending in (S.SUCCEEDED, S.FAILED, S.EXHAUSTED, S.REQUIRES_ACTION):
        assert sources(ending) == [S.RUNNING]


def test_a_service_asking_for_a_move_the_table_does_not_allow_is_refused() -> None:
    with pytest.raises(ValueError, match="may not move"):
        sources(S.QUEUED, among=[S.SUCCEEDED])


@pytest.mark.django_db
def test_a_claim_takes_a_queued_turn_but_not_an_ended_one() -> None:
    agent = AgentFactory.create()
    queued = TurnFactory.create(agent=agent, status=S.QUEUED)
    cancelled = TurnFactory.create(agent=agent, status=S.CANCELLED)
    assert turn_claim(turn_id=queued.pk, owner="test", now=queued.created_at)
    assert not turn_claim(turn_id=cancelled.pk, owner="test", now=queued.created_at)
    queued.refresh_from_db()
    cancelled.refresh_from_db()
    assert (queued.status, queued.attempts, cancelled.status) == (S.RUNNING, 1, S.CANCELLED)


@pytest.mark.django_db
def test_a_hand_back_queues_only_a_running_turn() -> None:
    agent = AgentFactory.create()
    held = TurnFactory.create(agent=agent, status=S.HELD)
    assert not turn_hand_back(turn=held)
    held.refresh_from_db()
    assert held.status == S.HELD


def _turn_status_writes(path: Path) -> list[str]:
    """Calls in ``path`` that write a turn's status through ``Turn.objects``: an ``update`` or
    ``create`` with ``status``, or any ``create``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in {
            "update",
            "create",
            "get_or_create",
            "update_or_create",
            "bulk_create",
            "bulk_update",
        }:
            continue
        chain = ast.unparse(node.func.value)
        if not chain.startswith("Turn.objects"):
            continue
        if node.func.attr.endswith("create") or any(k.arg == "status" for k in node.keywords):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_no_module_but_the_turn_services_writes_a_turns_status() -> None:
    writes = []
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "root_packages"
    ]
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != OWNER and "migrations" not in path.parts:
                writes += _turn_status_writes(path)
    assert not writes, f"Turn.status written outside turns/services.py: {writes}"
    assert _turn_status_writes(OWNER), (
        "the check found no write in the services either: it is looking for the wrong thing"
    )
