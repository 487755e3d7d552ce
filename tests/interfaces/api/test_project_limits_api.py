"""``PUT``/``GET``/``DELETE /projects/{name}/limits`` (API.md, architecture.md §6.14): operators
only, each bad value refused naming its field, every change audited; and the admin's project
page edits them the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agentops.models import AuditEntry, Project
from agentops.tokens import api_token_create

pytestmark = pytest.mark.django_db


def put(client: Client, name: str, body: Any) -> Any:
    return client.put(
        f"/api/v1/projects/{name}/limits", data=json.dumps(body), content_type="application/json"
    )


@pytest.fixture
def tenant() -> Client:
    token = api_token_create(name="alpha-bot", operator=False, project="alpha")[1]
    return Client(headers={"Authorization": f"Bearer {token}"})


def test_an_operator_sets_reads_and_lifts_a_projects_limits_each_change_audited(
    api: Client,
) -> None:
    Project.objects.create(name="alpha")
    assert api.get("/api/v1/projects/alpha/limits").json()["requests_per_minute"] is None
    answer = put(api, "alpha", {"requests_per_minute": 50, "concurrent_calls": 4})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["requests_per_minute"], body["tokens_per_minute"], body["concurrent_calls"]) == (
        50,
        None,
        4,
    )
    assert body["set_at"] is not None
    assert api.get("/api/v1/projects/alpha/limits").json() == body
    # A PUT states every limit: what it leaves out is no longer limited.
    assert put(api, "alpha", {"tokens_per_minute": 1000}).json()["requests_per_minute"] is None
    assert api.delete("/api/v1/projects/alpha/limits").status_code == 204
    assert api.delete("/api/v1/projects/alpha/limits").status_code == 404
    project = Project.objects.get(name="alpha")
    assert (project.requests_per_minute, project.tokens_per_minute, project.limits_set_at) == (
        None,
        None,
        None,
    )
    actions = list(
        AuditEntry.objects.filter(target="project:alpha")
        .order_by("id")
        .values_list("action", "actor")
    )
    assert actions == [
        ("project.limits-set", "api:test-operator"),
        ("project.limits-set", "api:test-operator"),
        ("project.limits-clear", "api:test-operator"),
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"requests_per_minute": -5}, "requests_per_minute"),
        ({"requests_per_minute": 100_001}, "requests_per_minute"),
        ({"tokens_per_minute": 2.5}, "tokens_per_minute"),
        ({"tokens_per_minute": "1000"}, "tokens_per_minute"),
        ({"concurrent_calls": True}, "concurrent_calls"),
        ({"concurrent_calls": 10_001}, "concurrent_calls"),
        ({"requests_per_minut": 5}, "requests_per_minut"),
        ([5], "body"),
    ],
)
def test_a_bad_limit_is_refused_naming_its_field_and_nothing_changes(
    api: Client, body: Any, field: str
) -> None:
    Project.objects.create(name="alpha", requests_per_minute=7)
    answer = put(api, "alpha", body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["data"]["field"] == field
    assert Project.objects.get(name="alpha").requests_per_minute == 7
    assert not AuditEntry.objects.filter(target="project:alpha").exists()


def test_a_tenant_gets_403_before_its_body_is_judged_even_for_its_own_project(
    tenant: Client,
) -> None:
    for body in ({"requests_per_minute": 5}, {"requests_per_minute": 0}, "not json"):
        assert put(tenant, "alpha", body).status_code == 403
    assert tenant.get("/api/v1/projects/alpha/limits").status_code == 403
    assert tenant.delete("/api/v1/projects/alpha/limits").status_code == 403
    assert Project.objects.get(name="alpha").requests_per_minute is None


def test_an_unknown_project_answers_404(api: Client) -> None:
    assert put(api, "nowhere", {"requests_per_minute": 5}).status_code == 404
    assert api.get("/api/v1/projects/nowhere/limits").status_code == 404


def test_the_admins_project_page_shows_and_edits_the_limits_audited(api: Client) -> None:
    project = Project.objects.create(name="alpha")
    staff = User.objects.create_superuser("ops", "ops@example.com", "pw")
    browser = Client()
    browser.force_login(staff)
    url = f"/admin/agentops/project/{project.pk}/change/"
    page = browser.get(url)
    assert page.status_code == 200 and b"requests_per_minute" in page.content
    form = {
        "name": "alpha",
        "requests_per_minute": "0",
        "tokens_per_minute": "",
        "concurrent_calls": "",
    }
    refused = browser.post(url, form)
    assert refused.status_code == 200  # the form again, with the error
    assert Project.objects.get(pk=project.pk).requests_per_minute is None
    saved = browser.post(url, {**form, "requests_per_minute": "30", "concurrent_calls": "2"})
    assert saved.status_code == 302, saved.content[:2000]
    project.refresh_from_db()
    assert (project.requests_per_minute, project.concurrent_calls) == (30, 2)
    assert project.limits_set_at is not None
    entry = AuditEntry.objects.get(target="project:alpha")
    assert (entry.action, entry.actor) == ("project.limits-set", "admin:ops")
    assert api.get("/api/v1/projects/alpha/limits").json()["requests_per_minute"] == 30
