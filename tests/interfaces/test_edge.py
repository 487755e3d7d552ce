"""The service's edge: JSON errors for unknown API routes and wrong methods, ``/`` and the
favicon, and the admin's way to the dashboard."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url", ["/api/v1/nope", "/api/v1/agents/ada/nope", "/api/v2/agents", "/api/"]
)
def test_an_unknown_api_route_answers_the_json_error_shape(api: Client, url: str) -> None:
    response = api.get(url)
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == "not_found" and url in body["message"] and body["data"] == {"path": url}


def test_an_unknown_agent_keeps_its_own_404(api: Client) -> None:
    body = api.get("/api/v1/agents/nobody").json()
    assert body["data"] == {"field": "name"}


@pytest.mark.parametrize(
    ("method", "url", "allowed"),
    [
        ("PUT", "/api/v1/agents", ["GET", "POST"]),
        ("DELETE", "/api/v1/health", ["GET"]),
        ("POST", "/api/v1/turns/1", ["GET"]),
    ],
)
def test_a_wrong_method_answers_405_in_the_json_error_shape(
    api: Client, method: str, url: str, allowed: list[str]
) -> None:
    response = api.generic(method, url, "{}", content_type="application/json")
    assert response.status_code == 405
    body = response.json()
    assert body["code"] == "method_not_allowed"
    assert sorted(body["data"]["allowed"]) == allowed
    assert method in body["message"]


def test_the_root_sends_staff_to_the_dashboard_and_others_to_the_api_docs(client: Client) -> None:
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/api/v1/docs")
    client.force_login(User.objects.create_user("ops", is_staff=True))
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/dashboard/")


def test_there_is_a_favicon(client: Client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"
    assert b"<svg" in response.content


def test_the_admin_header_links_the_dashboard_and_view_site_is_the_dashboard(
    admin_client: Client,
) -> None:
    page = admin_client.get("/admin/").content.decode()
    assert 'class="agentops-dashboard" href="/dashboard/"' in page
    assert '<a href="/dashboard/">View site</a>' in page


def test_a_token_path_runs_no_session_middleware_in_sync_mode_either(
    api: Client, admin_client: Client
) -> None:
    # As under uvicorn (tests/interfaces/test_edge_async.py): the tests' sync client must not
    # hand an API view a user or a session that production would not.
    api_request = api.get("/api/v1/agents").wsgi_request
    assert not hasattr(api_request, "user") and not hasattr(api_request, "session")
    admin_request = admin_client.get("/admin/").wsgi_request
    assert admin_request.user.is_staff and hasattr(admin_request, "session")
