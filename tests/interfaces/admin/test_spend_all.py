"""The admin's spend of all projects and the CSV of the calls a spend page sums (issue 55): each
project's spend over the page's days, every budget as a bar with its owner, held ones marked,
read in a fixed number of queries; the CSV streams one row per call, the page's rows exactly."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentops.models import Project
from interfaces.spend import CSV_HEADER
from tests.factories import AgentFactory, BudgetFactory
from tests.interfaces.test_spend_pages import (
    admin_client,
    at_local,
    ended,
    local_today,
    project_with_agent,
    set_budget,
    text,
)

pytestmark = pytest.mark.django_db

ALL = "/admin/agentops/project/spend/"
ALL_CSV = "/admin/agentops/project/spend.csv"
NEW_YORK = ZoneInfo("America/New_York")


def project_row(html: str, name: str) -> str:
    found = re.search(rf'<tr class="[^"]*" data-key="{re.escape(name)}">(.*?)</tr>', html, re.S)
    assert found is not None, f"no row for project {name}"
    return text(found.group(1))


def total_row(html: str) -> str:
    return text(html.split('<tr id="spend-total">', 1)[1].split("</tr>")[0])


def budget_row(html: str, kind: str, owner: str) -> str:
    found = re.search(
        rf'<tr class="budget[^"]*" data-kind="{kind}" data-owner="{re.escape(owner)}">(.*?)</tr>',
        html,
        re.S,
    )
    assert found is not None, f"no budget row for {kind} {owner}"
    return found.group(0)


def csv_rows(response: Any) -> list[dict[str, str]]:
    assert response.status_code == 200
    assert response.streaming, "the CSV is streamed, not built in memory"
    # Read as an ASGI server reads it: a chunk at a time from an async iterator (a sync one
    # Django would read whole before the first byte).
    assert response.is_async

    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    body = async_to_sync(read)().decode()
    reader = csv.reader(io.StringIO(body))
    header = next(reader)
    assert tuple(header) == CSV_HEADER
    return [dict(zip(header, row, strict=True)) for row in reader]


# --- the page -------------------------------------------------------------------------------


def test_the_page_shows_each_projects_spend_over_the_days_and_the_total() -> None:
    acme, ada, _ = project_with_agent("acme")
    _, bob, _ = project_with_agent("beta")
    project_with_agent("quiet")  # no calls: listed, empty
    now = timezone.now()
    ended(ada, now, "1.5", input_tokens=1000)
    ended(AgentFactory.create(name="ada-2", project=acme), now, None)
    ended(bob, now - timedelta(days=2), "0.25", output_tokens=40)
    ended(bob, now - timedelta(days=10), "7")  # outside 7 days, inside 30
    client = admin_client()
    html = client.get(ALL).content.decode()
    assert project_row(html, "acme") == "acme 1.5 (+1 unpriced) 2 1 1100 20"
    assert project_row(html, "beta") == "beta 7.25 2 0 200 50"
    assert project_row(html, "quiet") == "quiet no calls 0 0 0 0"
    assert total_row(html) == "total 8.75 (+1 unpriced) 4 1 1300 70"
    assert html.count('<g class="day') == 30
    week = client.get(ALL, {"days": "7"}).content.decode()
    assert project_row(week, "beta") == "beta 0.25 1 0 100 40"
    assert total_row(week) == "total 1.75 (+1 unpriced) 3 1 1200 60"
    assert week.count('<g class="day') == 7
    assert f'href="/admin/agentops/project/{acme.pk}/spend/?days=7"' in week


@pytest.mark.parametrize("days", ["0", "367", "x"])
def test_a_bad_number_of_days_answers_a_message(days: str) -> None:
    client = admin_client()
    response = client.get(ALL, {"days": days})
    assert response.status_code == 400
    assert "days must be a whole number from 1 to 366" in response.content.decode()
    assert client.get(ALL_CSV, {"days": days}).status_code == 400


def test_every_budget_is_a_bar_of_spent_and_reserved_with_its_owner_and_held_ones_marked() -> None:
    acme, ada, _ = project_with_agent("acme")
    _, bob, _ = project_with_agent("beta")
    BudgetFactory.create(
        agent=ada, amount=Decimal("2"), spent=Decimal("0.5"), reserved=Decimal("0.25")
    )
    BudgetFactory.create(project=acme, amount=Decimal("10"), period="month", held=True)
    BudgetFactory.create(
        agent=bob, amount=Decimal("4"), period="week", spent=Decimal("3"), reserved=Decimal("3")
    )
    html = admin_client().get(ALL).content.decode()
    mine = budget_row(html, "agent", ada.name)
    assert 'data-share="25.00"' in mine and 'data-share="12.50"' in mine  # 0.5/2, 0.25/2
    assert "held" not in text(mine) and 'class="budget-bar"' in mine
    assert text(mine).startswith(f"agent {ada.name} of acme")
    assert f'href="/admin/agentops/agent/{ada.pk}/budget/"' in mine
    project = budget_row(html, "project", "acme")
    assert 'class="budget held"' in project and 'class="budget-bar held"' in project
    assert 'data-share="100.00"' in project and 'data-share="0.00"' in project
    assert f'href="/admin/agentops/project/{acme.pk}/budget/"' in project
    # Reserved past the amount: the bar ends at the amount and the page says by how much.
    over = budget_row(html, "agent", bob.name)
    assert (
        'data-share="75.00"' in over
        and 'data-share="25.00"' in over
        and "spent and reserved over by 2" in over
    )
    # Grouped by project, the project's own budget first.
    order = re.findall(r'data-kind="(\w+)" data-owner="([^"]+)"', html)
    assert order == [("project", "acme"), ("agent", ada.name), ("agent", bob.name)]


def test_the_page_reads_a_fixed_number_of_queries_whatever_the_projects_and_budgets() -> None:
    now = timezone.now()

    def more(n: int, start: int) -> None:
        for i in range(start, start + n):
            project, agent, _ = project_with_agent(f"p{i}")
            ended(agent, now, "0.5")
            set_budget(agent, "3", "day", now=now)
            set_budget(project, "30", "month", now=now)

    more(2, 0)
    client = admin_client()
    client.get(ALL)  # the session and the content types are read once
    with CaptureQueriesContext(connection) as few:
        assert client.get(ALL).status_code == 200
    more(15, 2)
    with CaptureQueriesContext(connection) as many:
        html = client.get(ALL).content.decode()
    assert len(many) == len(few), [q["sql"][:100] for q in many.captured_queries]
    assert html.count('class="budget-bar"') == 34
    assert total_row(html).startswith("total 8.5 17 ")


def test_the_page_reads_at_most_eight_queries(django_assert_max_num_queries: Any) -> None:
    project, agent, _ = project_with_agent("acme")
    ended(agent, timezone.now(), "0.5")
    set_budget(project, "30", "month", now=timezone.now())
    client = admin_client()
    client.get(ALL)
    # The session, the user, the projects, two grouped sums, the currency and the budgets.
    with django_assert_max_num_queries(8):
        client.get(ALL)


def test_the_page_is_for_staff_with_the_view_permission_and_linked_from_the_projects() -> None:
    assert Client().get(ALL)["Location"].startswith("/admin/login/")
    assert Client().get(ALL_CSV)["Location"].startswith("/admin/login/")
    not_staff = Client()
    not_staff.force_login(User.objects.create_user("nick", password="x"))
    assert not_staff.get(ALL_CSV)["Location"].startswith("/admin/login/")
    staff = Client()
    olga = User.objects.create_user("olga", password="x", is_staff=True)
    staff.force_login(olga)
    assert staff.get(ALL).status_code == 403 and staff.get(ALL_CSV).status_code == 403
    olga.user_permissions.add(Permission.objects.get(codename="view_project"))
    assert staff.get(ALL).status_code == 200 and staff.get(ALL_CSV).status_code == 200
    listing = admin_client().get("/admin/agentops/project/").content.decode()
    assert f'href="{ALL}"' in listing


# --- the CSV --------------------------------------------------------------------------------


@override_settings(AGENTOPS_BUDGET_TIME_ZONE="America/New_York")
def test_the_csv_has_a_row_per_call_the_page_sums_and_its_costs_sum_to_the_pages_total() -> None:
    acme, ada, _ = project_with_agent("acme")
    _, bob, _ = project_with_agent("beta")
    today = local_today(NEW_YORK)
    late = at_local(today - timedelta(days=1), 23, 30, NEW_YORK)  # 04:30 UTC today
    costs = ["0.000000000001", "1.333333333333", "2.5", "0.1"]
    for n, cost in enumerate(costs):
        ended(ada, late - timedelta(hours=n), cost)
    ended(ada, late, None)
    ended(bob, late, "100")  # another project's
    ended(ada, late - timedelta(days=8), "50")  # before the 7 days
    client = admin_client()
    page = client.get(f"/admin/agentops/project/{acme.pk}/spend/", {"days": "7"})
    shown = total_row(page.content.decode()).split()[1]
    assert shown == "3.933333333334"
    response = client.get(f"/admin/agentops/project/{acme.pk}/spend.csv", {"days": "7"})
    assert response["Content-Type"] == "text/csv"
    assert response["Content-Disposition"].startswith('attachment; filename="spend-')
    rows = csv_rows(response)
    assert len(rows) == 5 and {r["project"] for r in rows} == {"acme"}
    assert sum(Decimal(r["cost"]) for r in rows if r["cost"]) == Decimal(shown)
    assert [r["cost"] for r in rows if not r["cost"]] == [""]  # unpriced: empty, never 0
    last = rows[-1]
    assert last["ended_at"] == late.isoformat() == f"{today - timedelta(days=1)}T23:30:00-05:00"
    assert late.astimezone(UTC).date() == today
    assert (last["agent"], last["outcome"], last["input_tokens"], last["currency"]) == (
        ada.name,
        "completed",
        "100",
        "USD",
    )
    # All projects: the page's total and the CSV's sum, over the same days.
    every = client.get(ALL, {"days": "7"}).content.decode()
    shown_all = total_row(every).split()[1]
    assert shown_all == "103.933333333334"
    all_rows = csv_rows(client.get(ALL_CSV, {"days": "7"}))
    assert len(all_rows) == 6
    assert sum(Decimal(r["cost"]) for r in all_rows if r["cost"]) == Decimal(shown_all)


def test_a_name_a_spreadsheet_would_run_is_quoted_in_the_csv() -> None:
    project = Project.objects.create(name="=HYPERLINK(1)")
    agent = AgentFactory.create(name="ada", project=project)
    ended(agent, timezone.now(), "1", model="+cmd")
    [row] = csv_rows(admin_client().get(ALL_CSV))
    assert (row["project"], row["model"]) == ("'=HYPERLINK(1)", "'+cmd")
