"""Spend read back by local day (issue 48): ``GET /spend?group_by=day``, the admin's spend page
of a project with its daily chart, and today's spend on the dashboard. A day is the local date
of a call's end in ``AGENTOPS_BUDGET_TIME_ZONE``; an unpriced call is shown as unpriced, never
as a cost of 0; a project sees only its own agents' calls."""

from __future__ import annotations

import re
import time as clock
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentops.budget_api import budget_put
from agentops.models import Agent, Budget, Project
from agentops.tokens import api_token_create
from inference.models import InferenceCall
from interfaces.dashboard import dashboard_snapshot
from interfaces.spend import spent_since
from tests.factories import AgentFactory, BudgetFactory, CallFactory
from turns.runtime import TurnRuntime

pytestmark = pytest.mark.django_db

NEW_YORK = ZoneInfo("America/New_York")


def set_budget(owner: Any, amount: str, period: str, *, now: Any, warn_at: str = "0.8") -> None:
    """A budget as the API sets it (its ledger from the period's calls so far)."""
    budget_put(
        owner=owner,
        amount=Decimal(amount),
        period=period,
        warn_at=Decimal(warn_at),
        now=now,
        spent_since=partial(spent_since, owner),
    )


def agent_and_held_project_budgets(agent: Any, project: Any, now: Any) -> None:
    """2 a day on the agent (its ledger from today's calls); 10 a month on its project, spent
    and held."""
    set_budget(agent, "2", "day", now=now)
    BudgetFactory.create(
        project=project, amount=Decimal("10"), period="month", warn_at=Decimal("1"), held=True
    )


def ended(agent: Agent, at: datetime, cost: str | None, **fields: Any) -> InferenceCall:
    """An ended call of ``agent`` at ``at``: priced at ``cost``, or unpriced (None)."""
    call: InferenceCall = CallFactory.create(
        agent=agent,
        outcome="completed",
        sent_at=at - timedelta(seconds=2),
        ended_at=at,
        cost=None if cost is None else Decimal(cost),
        cost_basis="unpriced" if cost is None else "priced",
        input_tokens=fields.pop("input_tokens", 100),
        output_tokens=fields.pop("output_tokens", 10),
        **fields,
    )
    return call


def local_today(zone: ZoneInfo) -> date:
    return timezone.now().astimezone(zone).date()


def at_local(day: date, hour: int, minute: int, zone: ZoneInfo) -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=zone)


def by_day(client: Client, **query: str) -> dict[str, dict[str, Any]]:
    response = client.get("/api/v1/spend", {"group_by": "day", **query})
    assert response.status_code == 200, response.content
    return {i["key"]: i for i in response.json()["items"]}


def project_with_agent(name: str) -> tuple[Project, Agent, str]:
    """A project, an agent of it, and a token of the project."""
    token, secret = api_token_create(name=f"{name}-token", operator=False, project=name)
    project = Project.objects.get(pk=token.project_id)
    agent = AgentFactory.create(name=f"{name}-agent", project=project)
    return project, agent, secret


def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    return client


def page(client: Client, project: Project, **query: str) -> Any:
    return client.get(f"/admin/agentops/project/{project.pk}/spend/", query)


def text(html: str) -> str:
    """The words of ``html``, tags dropped, each run of white space one space."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def day_row(html: str, day: date) -> str:
    found = re.search(rf'<tr class="[^"]*" data-day="{day.isoformat()}">(.*?)</tr>', html, re.S)
    assert found is not None, f"no row for {day}"
    return text(found.group(1))


def chart_day(html: str, day: date) -> str:
    found = re.search(rf'<g class="[^"]*" data-day="{day.isoformat()}">.*?</g>', html, re.S)
    assert found is not None, f"no bar for {day}"
    return found.group(0)


# --- GET /spend?group_by=day ----------------------------------------------------------------


@override_settings(AGENTOPS_BUDGET_TIME_ZONE="America/New_York")
def test_a_call_ended_at_half_past_eleven_at_night_lands_on_its_local_day(api: Client) -> None:
    agent = AgentFactory.create(name="night-owl")
    yesterday = local_today(NEW_YORK) - timedelta(days=1)
    late = at_local(yesterday, 23, 30, NEW_YORK)  # 04:30 UTC the next day
    assert late.astimezone(UTC).date() == yesterday + timedelta(days=1)
    ended(agent, late, "0.25")
    ended(agent, at_local(yesterday, 0, 30, NEW_YORK), "0.5")  # 05:30 UTC, the same date
    items = by_day(api)
    assert list(items) == [yesterday.isoformat()]
    assert (items[yesterday.isoformat()]["cost"], items[yesterday.isoformat()]["calls"]) == (
        "0.75",
        2,
    )
    with override_settings(AGENTOPS_BUDGET_TIME_ZONE="UTC"):
        in_utc = by_day(api)
    assert {k: i["cost"] for k, i in in_utc.items()} == {
        yesterday.isoformat(): "0.5",
        (yesterday + timedelta(days=1)).isoformat(): "0.25",
    }


def test_a_day_of_unpriced_calls_is_unpriced_never_zero(api: Client) -> None:
    agent = AgentFactory.create()
    today = local_today(ZoneInfo("UTC"))
    noon = at_local(today, 12, 0, ZoneInfo("UTC"))
    ended(agent, noon - timedelta(days=1), None)
    ended(agent, noon, "0.125")
    ended(agent, noon, None, input_tokens=7, output_tokens=3)
    items = by_day(api)
    earlier = items[(today - timedelta(days=1)).isoformat()]
    assert (earlier["cost"], earlier["calls"], earlier["unpriced_calls"]) == (None, 1, 1)
    now = items[today.isoformat()]
    assert (now["cost"], now["calls"], now["unpriced_calls"]) == ("0.125", 2, 1)
    assert (now["input_tokens"], now["output_tokens"]) == (107, 13)


def test_a_project_token_sees_only_its_projects_days(api: Client) -> None:
    _, ours, ours_token = project_with_agent("ours")
    _, theirs, _ = project_with_agent("theirs")
    now = timezone.now()
    ended(ours, now, "0.1")
    ended(theirs, now, "0.2")
    ended(theirs, now - timedelta(days=3), "7")
    mine = by_day(Client(headers={"Authorization": f"Bearer {ours_token}"}))
    assert [(i["cost"], i["calls"]) for i in mine.values()] == [("0.1", 1)]
    assert sorted(i["cost"] for i in by_day(api).values()) == ["0.3", "7"]
    since = (now - timedelta(days=1)).isoformat()
    assert [i["cost"] for i in by_day(api, since=since).values()] == ["0.3"]


# --- the admin's spend page -----------------------------------------------------------------


@override_settings(AGENTOPS_BUDGET_TIME_ZONE="America/New_York")
def test_the_spend_page_cuts_days_in_the_budgets_zone_and_shows_each_day() -> None:
    project, agent, _ = project_with_agent("acme")
    today = local_today(NEW_YORK)
    yesterday = today - timedelta(days=1)
    ended(agent, at_local(yesterday, 23, 30, NEW_YORK), "1.5", input_tokens=1000)
    ended(agent, at_local(today, 0, 15, NEW_YORK), "0.25", output_tokens=40)
    html = page(admin_client(), project).content.decode()
    assert day_row(html, yesterday) == f"{yesterday} 1.5 1 0 1000 10"
    assert day_row(html, today) == f"{today} 0.25 1 0 100 40"
    # A day with no calls is there, and empty: no bar, no cost of 0.
    quiet = today - timedelta(days=2)
    assert day_row(html, quiet) == f"{quiet} no calls 0 0 0 0"
    assert 'class="day empty"' in chart_day(html, quiet) and "bar" not in chart_day(html, quiet)
    assert 'data-cost="1.5"' in chart_day(html, yesterday)
    assert 'data-cost="0.25"' in chart_day(html, today)
    assert html.count('<tr class="empty" data-day=') == 28  # 30 days by default
    total = html.split('<tr id="spend-total">', 1)[1].split("</tr>")[0]
    assert text(total) == "total 1.75 2 0 1100 50"
    first, since = today - timedelta(days=29), at_local(today - timedelta(days=29), 0, 0, NEW_YORK)
    assert (
        f"ended from {first} to {today}, local days in America/New_York as budgets count them "
        f"({since.astimezone(UTC):%Y-%m-%d %H:%M} to "
    ) in text(html)


def test_the_spend_page_shows_unpriced_calls_as_unpriced_never_as_zero() -> None:
    project, agent, _ = project_with_agent("acme")
    utc = ZoneInfo("UTC")
    today = local_today(utc)
    ended(agent, at_local(today, 10, 0, utc) - timedelta(days=1), None)
    ended(agent, at_local(today, 0, 1, utc), "2")
    ended(agent, at_local(today, 0, 2, utc), None)
    html = page(admin_client(), project).content.decode()
    only_unpriced = chart_day(html, today - timedelta(days=1))
    assert day_row(html, today - timedelta(days=1)).split()[1:4] == ["unpriced", "(1", "call)"]
    assert 'class="unpriced" data-unpriced="1"' in only_unpriced
    assert 'class="bar"' not in only_unpriced  # no bar: not a cost of 0
    assert day_row(html, today).split()[1:4] == ["2", "(+1", "unpriced)"]
    assert 'data-unpriced="1"' in chart_day(html, today) and 'data-cost="2"' in chart_day(
        html, today
    )
    agents = html.split('id="spend-agents"', 1)[1].split("</table>")[0]
    assert "2 (+2 unpriced)" in agents


def test_the_spend_page_never_shows_another_projects_calls() -> None:
    project, ours, _ = project_with_agent("ours")
    _, theirs, _ = project_with_agent("theirs")
    their_model = "their-secret-model"
    now = timezone.now()
    ended(ours, now, "0.1")
    ended(theirs, now, "123.456", model=their_model)
    html = page(admin_client(), project).content.decode()
    assert theirs.name not in html and their_model not in html and "123.456" not in html
    assert ours.name in html and 'data-cost="0.1"' in html


@pytest.mark.parametrize("days", ["0", "367", "-1", "1.5", "thirty", "9" * 30, "\uff11"])
def test_a_bad_number_of_days_answers_a_message_not_a_500(days: str) -> None:
    project, _, _ = project_with_agent("acme")
    response = page(admin_client(), project, days=days)
    assert response.status_code == 400
    assert "days must be a whole number from 1 to 366" in response.content.decode()


def test_the_number_of_days_sets_the_period() -> None:
    project, agent, _ = project_with_agent("acme")
    ended(agent, timezone.now() - timedelta(days=8), "5")
    client = admin_client()
    week = page(client, project, days="7").content.decode()
    assert week.count('data-day="') == 2 * 7  # a bar and a row per day
    assert 'data-cost="5"' not in week
    assert 'data-cost="5"' in page(client, project, days="9").content.decode()
    assert page(client, project, days="366").content.decode().count('<g class="day') == 366


def test_the_spend_page_shows_the_projects_budget_and_whether_it_holds() -> None:
    project, _, _ = project_with_agent("acme")
    client = admin_client()
    assert "No budget is set for this project." in page(client, project).content.decode()
    now = timezone.now()
    set_budget(project, "5", "day", now=now)
    shown = text(page(client, project).content.decode())
    assert "Budget: 5 USD per day; this day spent 0, reserved 0 (calls in flight)" in shown
    assert "; not held." in shown
    budget = Budget.objects.get(project=project)
    Budget.objects.filter(pk=budget.pk).update(
        spent=Decimal("5.5"), held_period=budget.period_start
    )
    shown = text(page(client, project).content.decode())
    assert "this day spent 5.5" in shown and "; held: calls are refused" in shown


def test_the_spend_page_is_for_staff_with_the_view_permission_and_linked_from_the_project() -> None:
    project, _, _ = project_with_agent("acme")
    url = f"/admin/agentops/project/{project.pk}/spend/"
    assert Client().get(url)["Location"].startswith("/admin/login/")
    not_staff = Client()
    not_staff.force_login(User.objects.create_user("nick", password="x"))
    assert not_staff.get(url)["Location"].startswith("/admin/login/")
    staff = Client()
    olga = User.objects.create_user("olga", password="x", is_staff=True)
    staff.force_login(olga)
    assert staff.get(url).status_code == 403
    olga.user_permissions.add(Permission.objects.get(codename="view_project"))
    assert staff.get(url).status_code == 200
    assert staff.get("/admin/agentops/project/99999/spend/").status_code == 404
    client = admin_client()
    assert f'href="{url}"' in client.get("/admin/agentops/project/").content.decode()
    change = client.get(f"/admin/agentops/project/{project.pk}/change/").content.decode()
    assert f'href="{url}"' in change


# --- the dashboard --------------------------------------------------------------------------


@override_settings(AGENTOPS_BUDGET_TIME_ZONE="America/New_York")
def test_the_dashboard_shows_todays_spend_per_agent_and_in_total(runtime: TurnRuntime) -> None:
    project, ada, _ = project_with_agent("acme")
    bob = AgentFactory.create(name="bob", project=project)
    AgentFactory.create(name="cleo", project=project)  # nothing today
    today = local_today(NEW_YORK)
    # The snapshot is read at 21:00 in New York: 02:00 UTC, already tomorrow there.
    evening = at_local(today, 21, 0, NEW_YORK)
    assert evening.astimezone(UTC).date() == today + timedelta(days=1)
    ended(ada, at_local(today, 0, 30, NEW_YORK), "0.25")
    ended(ada, at_local(today, 20, 30, NEW_YORK), "0.5")  # 01:30 UTC tomorrow: today here
    ended(ada, at_local(today, 0, 10, NEW_YORK), None)
    # Yesterday at 23:30 in New York is today in UTC: not today's.
    ended(ada, at_local(today - timedelta(days=1), 23, 30, NEW_YORK), "100")
    ended(bob, at_local(today, 0, 45, NEW_YORK), None)
    snapshot = dashboard_snapshot(runtime.pacer, now_ms=evening.timestamp() * 1000)
    total = snapshot["spend_today"]
    assert (total["cost"], total["calls"], total["unpriced_calls"]) == ("0.75", 4, 2)
    assert (total["day"], total["zone"], total["currency"]) == (
        today.isoformat(),
        "America/New_York",
        "USD",
    )
    spent = {b["agent"]: b["spend_today"] for b in snapshot["breakers"]}
    assert spent["acme-agent"] == {"cost": "0.75", "calls": 3, "unpriced_calls": 1}
    assert spent["bob"] == {"cost": None, "calls": 1, "unpriced_calls": 1}
    assert spent["cleo"] == {"cost": None, "calls": 0, "unpriced_calls": 0}


def test_the_dashboard_shows_each_agents_budgets_and_holds_in_one_read(
    runtime: TurnRuntime,
) -> None:
    project, ada, _ = project_with_agent("acme")
    bob = AgentFactory.create(name="bob", project=project)
    other = AgentFactory.create(name="zed")
    now = timezone.now()
    agent_and_held_project_budgets(ada, project, now)
    ended(bob, now, "0.5")
    snapshot = dashboard_snapshot(runtime.pacer, now_ms=clock.time() * 1000)
    budgets = {b["agent"]: b["budgets"] for b in snapshot["breakers"]}
    assert [
        (b["scope"], b["spent"], b["amount"], b["period"], b["held"]) for b in budgets[ada.name]
    ] == [
        ("agent", "0", "2", "day", False),
        ("project", "10", "10", "month", True),
    ]
    assert [(b["scope"], b["held"]) for b in budgets["bob"]] == [("project", True)]
    assert budgets[other.name] == []

    # The snapshot's cost does not grow with the agents: one grouped read for all of them.
    with CaptureQueriesContext(connection) as few:
        dashboard_snapshot(runtime.pacer, now_ms=clock.time() * 1000)
    for n in range(12):
        agent = AgentFactory.create(name=f"more-{n}", project=project)
        ended(agent, now, "0.01")
        set_budget(agent, "1", "week", now=now, warn_at="1")
    with CaptureQueriesContext(connection) as many:
        snapshot = dashboard_snapshot(runtime.pacer, now_ms=clock.time() * 1000)
    assert len(many) == len(few), [q["sql"][:120] for q in many.captured_queries]
    assert snapshot["spend_today"]["calls"] == 13


def test_the_dashboard_page_carries_todays_spend_and_its_script_shows_it() -> None:
    agent = AgentFactory.create(name="ada")
    ended(agent, timezone.now(), "0.125")
    client = Client()
    client.force_login(User.objects.create_user("olga", password="x", is_staff=True))
    html = client.get("/dashboard/").content.decode()
    assert '"spend_today": {"key": "total", "cost": "0.125"' in html
    assert "<th>spent today</th>" in html
