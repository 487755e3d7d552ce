"""The admin: records are read-only, and acknowledging alerts needs its own permission."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentops.alerts import alert_raise
from agentops.models import Alert, AuditEntry

pytestmark = pytest.mark.django_db


def staff(*perms: str) -> Client:
    user = User.objects.create_user(
        "op-" + "-".join(perms or ("none",)), password="x", is_staff=True
    )
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_alert", "view_auditentry", *perms])
    )
    client = Client()
    client.force_login(user)
    return client


def test_acknowledging_an_alert_needs_the_permission_and_is_audited() -> None:
    alert = alert_raise(kind="hard-down", agent="ada", message="down")
    without = staff()
    page = without.get("/admin/agentops/alert/")
    assert page.status_code == 200 and b"Acknowledge the selected alerts" not in page.content
    without.post(
        "/admin/agentops/alert/", {"action": "acknowledge", "_selected_action": [alert.pk]}
    )
    assert Alert.objects.get(pk=alert.pk).acknowledged_at is None

    allowed = staff("acknowledge_alert")
    assert b"Acknowledge the selected alerts" in allowed.get("/admin/agentops/alert/").content
    allowed.post(
        "/admin/agentops/alert/", {"action": "acknowledge", "_selected_action": [alert.pk]}
    )
    assert Alert.objects.get(pk=alert.pk).acknowledged_by == "admin:op-acknowledge_alert"
    assert (
        AuditEntry.objects.filter(action="alert.acknowledge", target=f"alert:{alert.pk}").count()
        == 1
    )


def test_nobody_edits_or_deletes_an_audit_entry_through_the_admin() -> None:
    entry = AuditEntry.objects.create(actor="api:x", action="wait.release", target="agent:ada")
    superuser = User.objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(superuser)
    assert client.get(f"/admin/agentops/auditentry/{entry.pk}/delete/").status_code == 403
    client.post(f"/admin/agentops/auditentry/{entry.pk}/change/", {"actor": "forged"})
    assert AuditEntry.objects.get(pk=entry.pk).actor == "api:x"


def test_restoring_a_set_aside_row_needs_the_permission_and_is_audited() -> None:
    from agentops.models import HistoryRow
    from tests.factories import HistoryRowFactory

    row = HistoryRowFactory.create(state=HistoryRow.State.SET_ASIDE, set_aside_by="breaker")
    without = staff("view_historyrow")
    page = without.get("/admin/agentops/historyrow/")
    assert (
        page.status_code == 200
        and b"SET ASIDE" in page.content
        and b"Restore the selected" not in page.content
    )
    without.post("/admin/agentops/historyrow/", {"action": "restore", "_selected_action": [row.pk]})
    assert HistoryRow.objects.get(pk=row.pk).state == HistoryRow.State.SET_ASIDE

    allowed = staff("view_historyrow", "restore_historyrow")
    confirmed = {"action": "restore", "_selected_action": [row.pk], "confirmed": "yes"}
    allowed.post("/admin/agentops/historyrow/", {**confirmed, "reason": "the provider is fixed"})
    assert HistoryRow.objects.get(pk=row.pk).state == HistoryRow.State.PRESENTED
    assert (
        AuditEntry.objects.filter(
            action="history.restore", actor="admin:op-view_historyrow-restore_historyrow"
        ).count()
        == 1
    )


def test_an_agents_alternates_are_checked_in_the_admin_as_in_the_api(
    make_agent: Any, providers: Any
) -> None:
    agent = make_agent(model="answer")
    client = staff("change_agent", "view_agent")
    url = f"/admin/agentops/agent/{agent.pk}/change/"
    form = {
        "name": agent.name,
        "project": agent.project_id,
        "kind": agent.kind,
        "provider": agent.provider_id,
        "model": agent.model,
        "participant": agent.participant,
        "system": "",
        "stream": "on",
        "tools": "[]",
        "context_policy": agent.context_policy,
    }
    same_model = client.post(
        url, {**form, "fallbacks": '[{"provider": "standin-openai", "model": "answer"}]'}
    )
    assert same_model.status_code == 200
    assert "is already the agent&#x27;s own provider and model" in same_model.content.decode()
    unknown = client.post(url, {**form, "fallbacks": '[{"provider": "nowhere", "model": "m"}]'})
    assert "no provider named" in unknown.content.decode()
    agent.refresh_from_db()
    assert agent.fallbacks == []

    saved = client.post(
        url, {**form, "fallbacks": '[{"provider": "standin-anthropic", "model": "claude-alt"}]'}
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    agent.refresh_from_db()
    assert agent.fallbacks == [
        {
            "provider": "standin-anthropic",
            "model": "claude-alt",
            "context_window": None,
            "provider_id": providers["anthropic"].pk,
            "kind": "anthropic",
        }
    ]
