"""``python manage.py release_wait`` and ``waits_checkpoint``."""

from __future__ import annotations

import getpass
import math
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agentops.models import Agent, AuditEntry
from waits.admission import admission_check
from waits.models import WaitJournalEntry
from waits.services import wait_record

from .conftest import NOW, manage

pytestmark = pytest.mark.django_db


@pytest.fixture
def held_agent(agent: Agent) -> Agent:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    wait_record(agent=agent, model="m2", retry_after_ms=math.nan, reason="429", now_ms=NOW)
    return agent


def release(*args: str) -> str:
    out = StringIO()
    call_command("release_wait", *args, stdout=out)
    return out.getvalue()


def test_the_command_releases_one_model_and_prints_its_receipt(held_agent: Agent) -> None:
    printed = release(
        "ada", "--model", "m2", "--requester", "oncall", "--reason", "provider recovered"
    )
    assert "released ada model m2 (held until released): recorded" in printed
    entry = AuditEntry.objects.get(action="wait.release")
    assert (entry.actor, entry.reason, entry.target) == (
        "command:oncall",
        "provider recovered",
        "ada/m2",
    )
    assert admission_check(agent=held_agent, model="m1", now_ms=NOW + 1) is not None


@pytest.mark.parametrize("model", [[], ["--model", "*"]])
def test_the_command_releases_every_model_without_a_model_or_with_star(
    held_agent: Agent, model: list[str]
) -> None:
    printed = release("ada", *model, "--reason", "provider recovered")
    assert printed.count(": recorded") == 2
    assert AuditEntry.objects.get().actor == f"command:{getpass.getuser()}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ada", "--model", "", "--reason", "x"], "model: must not be empty"),
        (
            ["ada", "--model", "m1\x1b[2K", "--reason", "x"],
            "model: must not contain control characters",
        ),
        (["ada\nforged", "--reason", "x"], "agent: must not contain control characters"),
        (["nobody", "--reason", "x"], "no agent named 'nobody'"),
    ],
)
def test_an_invalid_release_fails_with_the_services_message_and_changes_nothing(
    held_agent: Agent, args: list[str], message: str
) -> None:
    rows = WaitJournalEntry.objects.count()
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        release(*args)
    assert WaitJournalEntry.objects.count() == rows and not AuditEntry.objects.exists()


def test_the_command_requires_a_reason(held_agent: Agent) -> None:
    with pytest.raises(CommandError):
        release("ada")


@pytest.mark.django_db(transaction=True)
def test_the_command_exits_non_zero_on_a_refused_release(agent: Agent) -> None:
    refused = manage("release_wait", "ada", "--model", "", "--reason", "x")
    assert refused.returncode != 0
    assert "model: must not be empty" in refused.stderr
    assert not WaitJournalEntry.objects.exists() and not AuditEntry.objects.exists()
    ok = manage("release_wait", "ada", "--reason", "x")
    assert ok.returncode == 0, ok.stderr
    assert "No wait was binding for ada" in ok.stdout


def test_the_checkpoint_command_writes_a_checkpoint(held_agent: Agent) -> None:
    out = StringIO()
    call_command("waits_checkpoint", stdout=out)
    assert "checkpoint written" in out.getvalue()
    checkpoint = WaitJournalEntry.objects.get(kind="checkpoint")
    assert sorted(w["model"] for w in checkpoint.data["waits"]) == ["m1", "m2"]
