"""What an operator reads of which target served (issue 54, item 5): a turn's calls show the
provider, model, route and cost of each; the agents list and the binding waits mark an agent
an alternate serves; the admin's Restore asks for a reason, as Release does, and audits it."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentops.models import Agent, AuditEntry, HistoryRow, Provider
from agentops.services import fallbacks_checked
from calls.types import ProviderError
from inference.models import InferenceCall, Turn
from tests.factories import (
    AgentFactory,
    CallFactory,
    HistoryRowFactory,
    ProviderFactory,
    TurnFactory,
)
from waits.clock import clock_ms
from waits.limits import limit_record
from waits.services import wait_record

pytestmark = pytest.mark.django_db


def login(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def superuser() -> Client:
    return login(User.objects.create_superuser("root", password="x"))


@pytest.fixture
def agent() -> Agent:
    """``ada`` on p1 / m1, with one alternate: m2 on p2."""
    ProviderFactory.create(name="p2")
    made: Agent = AgentFactory.create(
        name="ada",
        model="m1",
        provider=ProviderFactory.create(name="p1"),
        fallbacks=fallbacks_checked(
            [{"provider": "p2", "model": "m2"}], model="m1", provider="p1", max_tokens=256
        ),
    )
    return made


def inline_rows(html: str) -> list[str]:
    """The turn page's calls, one string per row of the inline table."""
    table = html.split("inline-group", 1)[1]
    return [r for r in table.split("<tr")[1:] if "field-target" in r]


def cell(row: str, field: str) -> str:
    """The inner HTML of a row's ``field-<field>`` cell, without the template's line breaks."""
    found = re.search(rf'<td class="field-{field}">(.*?)</td>', row, re.S)
    assert found is not None, (field, row)
    return re.sub(r"\s*\n\s*", "", found.group(1))  # the template's line breaks only


def test_a_fallback_turns_calls_show_each_target_route_and_cost(agent: Agent) -> None:
    turn = TurnFactory.create(agent=agent, status=Turn.Status.SUCCEEDED)
    CallFactory.create(
        turn=turn,
        agent=agent,
        provider=agent.provider,
        model="m1",
        route="primary",
        outcome=InferenceCall.Outcome.ERROR,
        error={"type": "server", "http_status": 503, "message": "down", "retryable": True},
        cost=Decimal(0),
        cost_basis="nothing used",
    )
    CallFactory.create(
        turn=turn,
        agent=agent,
        provider=Provider.objects.get(name="p2"),
        model="m2",
        route="fallback: primary down (server error)",
        route_kind="fallback",
        outcome=InferenceCall.Outcome.COMPLETED,
        cost=Decimal("0.004215"),
        cost_basis="priced",
    )
    page = superuser().get(f"/admin/inference/turn/{turn.pk}/change/").content.decode()
    first, second = inline_rows(page)
    assert cell(first, "target") == (
        '<p><span class="call-target"><strong>m1</strong> on p1<br>'
        '<span class="call-route">primary</span></span></p>'
    )
    assert cell(first, "cost_text") == "<p>0</p>"
    assert cell(second, "target") == (
        '<p><span class="call-target"><strong>m2</strong> on p2<br>'
        '<span class="call-route call-route-fallback">fallback: primary down (server error)'
        "</span></span></p>"
    )
    assert cell(second, "cost_text") == "<p>0.004215</p>"


def test_an_agent_on_its_alternate_is_marked_in_the_agents_list_and_the_binding_waits(
    agent: Agent,
) -> None:
    AgentFactory.create(name="bob", model="m1")  # no alternates: never marked
    client = superuser()
    listing = client.get("/admin/agentops/agent/").content.decode()
    assert "on alternate" not in listing  # its own model serves until it is held

    # Held longer than AGENTOPS_FALLBACK_AFTER_MS: the next call goes to the alternate.
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=clock_ms())
    listing = client.get("/admin/agentops/agent/").content.decode()
    marks = re.findall(r'<span class="on-alternate" title="([^"]*)">([^<]*)</span>', listing)
    assert len(marks) == 1, marks
    reason, mark = marks[0]
    assert mark == "on alternate: m2 on p2" and reason.startswith("fallback: primary held")

    waits = client.get("/admin/waits/bindingwait/").content.decode()
    assert waits.count('class="on-alternate"') == 1
    assert "on alternate: m2 on p2" in waits

    # Its change page says so too (read as the page fetches the row, through the runtime the
    # request carries).
    page = client.get(f"/admin/agentops/agent/{agent.pk}/change/").content.decode()
    assert "m2 on p2 (fallback: primary held" in page, page


def test_a_providers_page_shows_the_scoped_wait_that_holds_its_account() -> None:
    """The limits are read as the page fetches the row, through the runtime the request
    carries."""
    provider = ProviderFactory.create(name="p1")
    agent = AgentFactory.create(name="ada", model="m1", provider=provider)
    client = superuser()
    page = client.get(f"/admin/agentops/provider/{provider.pk}/change/").content.decode()
    assert "none known: no answer with quota headers yet" in page
    limited = ProviderError(
        type="rate_limit",
        message="the organization's limit",
        http_status=429,
        retry_after_ms=600_000,
        scope="provider",
    )
    limit_record(agent=agent, provider=provider, model="m1", error=limited, now_ms=clock_ms())
    page = client.get(f"/admin/agentops/provider/{provider.pk}/change/").content.decode()
    table = page.split("class='provider-limits'", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td>([^<]*)</td>", table)
    assert rows == ["*"], table  # the whole account
    assert "release-limit" in table


def staff_restorer() -> Client:
    user = User.objects.create_user("olga", password="x", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_historyrow", "restore_historyrow"])
    )
    return login(user)


def test_restore_in_the_admin_asks_for_a_reason_and_audits_it() -> None:
    row = HistoryRowFactory.create(
        state=HistoryRow.State.SET_ASIDE, set_aside_by="breaker", set_aside_reason="poisoned"
    )
    client = staff_restorer()
    chosen = {"action": "restore", "_selected_action": [row.pk]}

    asked = client.post("/admin/agentops/historyrow/", chosen)
    assert asked.status_code == 200
    page = asked.content.decode()
    assert 'name="reason"' in page and "Reason (required)" in page and "poisoned" in page
    assert HistoryRow.objects.get(pk=row.pk).state == HistoryRow.State.SET_ASIDE

    for blank in ("", "   "):
        refused = client.post(
            "/admin/agentops/historyrow/", {**chosen, "confirmed": "yes", "reason": blank}
        )
        assert refused.status_code == 400
        assert "reason: a reason is required" in refused.content.decode()
    assert HistoryRow.objects.get(pk=row.pk).state == HistoryRow.State.SET_ASIDE
    assert not AuditEntry.objects.filter(action="history.restore").exists()

    done = client.post(
        "/admin/agentops/historyrow/",
        {**chosen, "confirmed": "yes", "reason": "the provider fixed its parser"},
    )
    assert done.status_code == 302
    assert HistoryRow.objects.get(pk=row.pk).state == HistoryRow.State.PRESENTED
    [audit] = AuditEntry.objects.filter(action="history.restore")
    assert audit.actor == "admin:olga"
    assert audit.reason == "the provider fixed its parser"
    assert audit.data["reason"] == "the provider fixed its parser"
    assert audit.data["set_aside_reason"] == "poisoned"
