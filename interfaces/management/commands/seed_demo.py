"""Create (or repoint) the demo providers and agents on the stand-in provider, the real
providers whose key is in the environment (OpenAI, Anthropic) with an agent on each, an admin
user and an operator API token. Credentials are made once and kept in the file named by
--credentials, so every later `make run` can print the same ones."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from agentops.models import Agent, Provider
from agentops.tokens import api_token_check, api_token_create

DEMO_AGENTS = [
    # name, provider, model (a stand-in scenario), stream, tools
    ("demo", "standin-openai", "answer", True, []),
    ("demo-anthropic", "standin-anthropic", "think", True, []),
    ("demo-unstreamed", "standin-openai", "answer", False, []),
    (
        "demo-tools",
        "standin-anthropic",
        "tool",
        True,
        [
            {
                "name": "lookup",
                "description": "Look something up.",
                "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
            }
        ],
    ),
]


# The real providers `make run` connects when their key is in the environment: name, kind,
# official base URL, key variable, the demo agent's name and the setting naming its model.
REAL_PROVIDERS = [
    (
        "openai",
        "openai",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
        "openai-demo",
        "AGENTOPS_DEMO_OPENAI_MODEL",
    ),
    (
        "anthropic",
        "anthropic",
        "https://api.anthropic.com",
        "ANTHROPIC_API_KEY",
        "anthropic-demo",
        "AGENTOPS_DEMO_ANTHROPIC_MODEL",
    ),
]


class Command(BaseCommand):
    help = "Seed demo providers, agents, an admin user and an API token (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--standin-url", required=True)
        parser.add_argument(
            "--credentials", required=True, help="JSON file that keeps the demo credentials"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["standin_url"].rstrip("/")
        Provider.objects.update_or_create(
            name="standin-openai", defaults={"kind": "openai", "base_url": f"{url}/v1"}
        )
        Provider.objects.update_or_create(
            name="standin-anthropic", defaults={"kind": "anthropic", "base_url": url}
        )
        for name, provider, model, stream, tools in DEMO_AGENTS:
            Agent.objects.update_or_create(
                name=name,
                defaults={
                    "provider": Provider.objects.get(name=provider),
                    "model": model,
                    "stream": stream,
                    "tools": tools,
                    "participant": name,
                    "max_tokens": 1024,
                    "system": "You are a demo agent answered by the agentops stand-in provider.",
                },
            )
        for name, kind, base_url, key_env, agent_name, model_setting in REAL_PROVIDERS:
            if not os.environ.get(key_env):
                continue
            real, _ = Provider.objects.update_or_create(
                name=name, defaults={"kind": kind, "base_url": base_url, "api_key_env": key_env}
            )
            model = getattr(settings, model_setting)
            Agent.objects.update_or_create(
                name=agent_name,
                defaults={
                    "provider": real,
                    "model": model,
                    "participant": agent_name,
                    "max_tokens": 1024,
                },
            )
            self.stdout.write(
                f"{key_env} is set: provider {name!r} ({base_url}) "
                f"with agent {agent_name!r} on {model} (the model: {model_setting})"
            )
        path = Path(options["credentials"])
        creds: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        User = get_user_model()
        if (
            not creds.get("admin_password")
            or not User.objects.filter(username=creds.get("admin_user", "admin")).exists()
        ):
            password = secrets.token_urlsafe(12)
            user, _ = User.objects.get_or_create(
                username="admin", defaults={"is_staff": True, "is_superuser": True}
            )
            user.is_staff = user.is_superuser = True
            user.set_password(password)
            user.save()
            creds.update(admin_user="admin", admin_password=password)
            self.stdout.write(f"created the admin user 'admin' with password {password}")
        if not creds.get("api_token") or api_token_check(creds["api_token"]) is None:
            _, token = api_token_create(name="demo", operator=True)
            creds["api_token"] = token
            self.stdout.write("created an operator API token named 'demo'")
        path.write_text(json.dumps(creds, indent=2))
        path.chmod(0o600)
        self.stdout.write(
            f"demo agents: {', '.join(a[0] for a in DEMO_AGENTS)} (stand-in at {url})"
        )
