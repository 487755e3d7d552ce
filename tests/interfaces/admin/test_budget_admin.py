"""An agent's budget in the admin (issue 55): its change page shows the budget's figures, its
budget page sets, changes and removes it through the API's own check and write (a bad value is
a form error naming the field and changes nothing), and only a user who may change the agent
may do so."""

from __future__ import annotations

import html as markup
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from agentops.models import Agent, Budget
from tests.factories import BudgetFactory
from tests.interfaces.test_spend_pages import (
    admin_client,
    ended,
    project_with_agent,
    set_budget,
    text,
)

pytestmark = pytest.mark.django_db


def budget_url(agent: Agent) -> str:
    return f"/admin/agentops/agent/{agent.pk}/budget/"


def post(client: Client, agent: Agent, **fields: str) -> Any:
    return client.post(budget_url(agent), {"action": "set", **fields})


def stored(agent: Agent) -> tuple[Any, ...] | None:
    """Everything a write could change on the agent's budget row (None: no row)."""
    b = Budget.objects.filter(agent=agent).first()
    if b is None:
        return None
    return (
        b.amount,
        b.period,
        b.warn_at,
        b.spent,
        b.reserved,
        b.period_start,
        b.ledger,
        b.held_period,
        b.updated_at,
    )


def test_the_agent_page_shows_its_budget_as_the_api_reads_it() -> None:
    _, agent, _ = project_with_agent("acme")
    now = timezone.now()
    ended(agent, now - timedelta(seconds=5), "1.25")
    set_budget(agent, "4", "month", now=now, warn_at="0.5")
    Budget.objects.filter(agent=agent).update(reserved=Decimal("0.5"))
    client = admin_client()
    change = text(client.get(f"/admin/agentops/agent/{agent.pk}/change/").content.decode())
    assert (
        "4 per month (warn at 0.5) · spent 1.25 · reserved 0.5 · left 2.25 · not held · resets "
    ) in change
    assert (
        f'href="{budget_url(agent)}"'
        in client.get(f"/admin/agentops/agent/{agent.pk}/change/").content.decode()
    )
    page = client.get(budget_url(agent)).content.decode()
    figures = text(page.split('id="budget-own"', 1)[1].split("</table>")[0])
    assert "amount 4 USD per month" in figures and "warn at 0.5 of the amount" in figures
    assert "spent 1.25 reserved 0.5 (calls in flight) left 2.25 held no resets at " in figures
    assert 'data-share="31.25"' in page and 'data-share="12.50"' in page  # 1.25/4, 0.5/4


def test_an_agent_without_a_budget_says_so_and_offers_to_set_one() -> None:
    _, agent, _ = project_with_agent("acme")
    client = admin_client()
    change = text(client.get(f"/admin/agentops/agent/{agent.pk}/change/").content.decode())
    assert "none · set a budget" in change
    page = client.get(budget_url(agent)).content.decode()
    assert "No budget is set for this agent." in page and "Set a budget" in page


def test_a_budget_set_in_the_admin_starts_its_ledger_as_the_api_does() -> None:
    _, agent, _ = project_with_agent("acme")
    now = timezone.now()
    ended(agent, now - timedelta(seconds=5), "0.75")  # today's: counted
    ended(agent, now - timedelta(days=40), "9")  # last month's: not
    client = admin_client()
    response = post(client, agent, amount="3.50", period="month", warn_at="0.9")
    assert response.status_code == 302 and response["Location"] == budget_url(agent)
    b = Budget.objects.get(agent=agent)
    assert (b.amount, b.period, b.warn_at, b.spent, b.ledger) == (
        Decimal("3.5"),
        "month",
        Decimal("0.9"),
        Decimal("0.75"),
        1,
    )
    # Changed with the same period, the ledger is kept; the raise lifts the hold.
    Budget.objects.filter(pk=b.pk).update(
        spent=Decimal("3.5"), held_period=b.period_start, reserved=Decimal("0.25")
    )
    post(client, agent, amount="10", period="month", warn_at="0.8")
    b.refresh_from_db()
    assert (b.amount, b.spent, b.reserved, b.ledger, b.held_period) == (
        Decimal("10"),
        Decimal("3.5"),
        Decimal("0.25"),
        1,
        None,
    )


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"amount": "0"}, "amount", "amount: must be more than 0 and less than"),
        ({"amount": "lots"}, "amount", "amount: 'lots' is not a decimal amount"),
        ({"amount": "NaN"}, "amount", "amount: must be a finite amount"),
        ({"amount": "0.0000000000001"}, "amount", "amount: must have at most 12 decimal places"),
        ({"amount": ""}, "amount", "This field is required."),
        ({"warn_at": "1.5"}, "warn_at", "warn_at: must be more than 0 and at most 1"),
        ({"warn_at": "0.12345"}, "warn_at", "with 4 places at most"),
        ({"period": "year"}, "period", "Select a valid choice."),
    ],
)
def test_a_bad_value_is_a_form_error_naming_the_field_and_changes_nothing(
    fields: dict[str, str], field: str, message: str
) -> None:
    _, agent, _ = project_with_agent("acme")
    BudgetFactory.create(agent=agent, amount=Decimal("5"), period="week")
    before = stored(agent)
    body = {"amount": "7", "period": "day", "warn_at": "0.8", **fields}
    response = post(admin_client(), agent, **body)
    assert response.status_code == 400
    html = response.content.decode()
    errors = re.search(rf'<ul class="errorlist" id="error-{field}">(.*?)</ul>', html, re.S)
    assert errors is not None, text(html)[:600]
    assert message in markup.unescape(text(errors.group(1)))
    assert stored(agent) == before


def test_a_budget_removed_in_the_admin_is_gone_and_its_hold_with_it() -> None:
    _, agent, _ = project_with_agent("acme")
    BudgetFactory.create(agent=agent, amount=Decimal("1"))
    client = admin_client()
    response = client.post(budget_url(agent), {"action": "remove"})
    assert response.status_code == 302
    assert not Budget.objects.filter(agent=agent).exists()
    assert "The budget of agent acme-agent was removed." in text(
        client.get(budget_url(agent)).content.decode()
    )


def test_only_a_user_who_may_change_the_agent_sets_its_budget() -> None:
    _, agent, _ = project_with_agent("acme")
    BudgetFactory.create(agent=agent, amount=Decimal("5"), period="week")
    before = stored(agent)
    viewer = User.objects.create_user("vera", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_agent"))
    client = Client()
    client.force_login(viewer)
    page = client.get(budget_url(agent))
    assert page.status_code == 200 and "Save budget" not in page.content.decode()
    assert post(client, agent, amount="99", period="day", warn_at="0.8").status_code == 403
    assert client.post(budget_url(agent), {"action": "remove"}).status_code == 403
    assert stored(agent) == before
    nobody = Client()
    nobody.force_login(User.objects.create_user("nick", password="x", is_staff=True))
    assert nobody.get(budget_url(agent)).status_code == 403
    assert Client().get(budget_url(agent))["Location"].startswith("/admin/login/")


def test_a_disposed_agent_takes_no_budget_as_in_the_api_but_its_budget_may_be_removed() -> None:
    _, agent, _ = project_with_agent("acme")
    BudgetFactory.create(agent=agent, amount=Decimal("5"), period="week")
    Agent.objects.filter(pk=agent.pk).update(disposed_at=timezone.now())
    before = stored(agent)
    client = admin_client()
    page = client.get(budget_url(agent)).content.decode()
    assert "This agent is disposed: it takes no budget" in page and "Save budget" not in page
    response = post(client, agent, amount="9", period="day", warn_at="0.8")
    assert response.status_code == 400
    assert "agent acme-agent is disposed: it takes no budget" in response.content.decode()
    assert stored(agent) == before
    assert client.post(budget_url(agent), {"action": "remove"}).status_code == 302
    assert stored(agent) is None
