"""The production topology's edges (issue: the first hour): liveness apart from readiness,
static files through WhiteNoise on the ASGI app, and the secret key refused when it is the
default or empty."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
from django.test import Client

from interfaces.asgi import application
from tests.conftest import BASE_DIR

pytestmark = pytest.mark.django_db


def test_liveness_answers_without_asking_the_database_or_redis(
    django_assert_num_queries: object,
) -> None:
    with django_assert_num_queries(0):  # type: ignore[operator]
        response = Client().get("/health/live")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readiness_is_the_health_report() -> None:
    ready = Client().get("/health/ready")
    assert ready.status_code == 200
    assert (
        ready.json()["database"] is True
        and ready.json()["redis"] is True
        and ready.json()["journal_readable"] is True
    )


def asgi_get(path: str) -> httpx.Response:
    async def get() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://testserver"
        ) as client:
            return await client.get(path)

    return asyncio.run(get())


def test_static_files_come_from_whitenoise_with_caching_headers() -> None:
    script = asgi_get("/static/agentops/dashboard.js")
    assert script.status_code == 200 and b'"/ws/dashboard"' in script.content
    assert script.headers["cache-control"] == "max-age=3600, public"
    assert asgi_get("/static/admin/css/base.css").status_code == 200  # the admin's, from its app
    assert asgi_get("/static/nothing-here.css").status_code == 404


@pytest.mark.parametrize("key", ["", "change-me", "agentops-dev-only-not-secret"])
def test_the_service_refuses_to_start_with_a_default_or_empty_secret_key(key: str) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agentops.settings", "DJANGO_SECRET_KEY": key}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "agentops: configuration error: DJANGO_SECRET_KEY must be set to a long random value"
        )
    )


def test_the_compose_settings_pass_djangos_deploy_checks() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "agentops.settings",
        "DJANGO_SECRET_KEY": "k" * 20 + "a1b2c3d4e5f6g7h8i9j0" + "z" * 20,
        "AGENTOPS_BEHIND_TLS_PROXY": "true",
        "DJANGO_ALLOWED_HOSTS": "agentops.example.com",
        "DJANGO_DEBUG": "false",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
