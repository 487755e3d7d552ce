"""Connecting a real provider in the first five minutes (issue: the first hour): ``make run``
adds OpenAI and Anthropic when their key is in the environment, and ``manage.py
add_provider`` adds any other as the API would."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from agentops.models import Agent, Provider

pytestmark = pytest.mark.django_db


def seed(tmp_path: Path) -> None:
    call_command(
        "seed_demo",
        "--standin-url",
        "http://127.0.0.1:9",
        "--credentials",
        str(tmp_path / "creds.json"),
    )


def test_make_run_adds_a_real_provider_and_an_agent_for_each_key_that_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    seed(tmp_path)
    provider = Provider.objects.get(name="openai")
    assert (provider.kind, provider.base_url, provider.api_key_env) == (
        "openai",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
    )
    agent = Agent.objects.get(name="openai-demo")
    assert agent.provider == provider and agent.model == "gpt-5-mini"
    assert not Provider.objects.filter(name="anthropic").exists()
    assert (
        "provider 'openai' (https://api.openai.com/v1) with agent 'openai-demo' on gpt-5-mini"
        in capsys.readouterr().out
    )


def test_the_demo_agents_model_is_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    settings.AGENTOPS_DEMO_ANTHROPIC_MODEL = "claude-sonnet-4-5"  # type: ignore[attr-defined]
    seed(tmp_path)
    assert Agent.objects.get(name="anthropic-demo").model == "claude-sonnet-4-5"
    assert Provider.objects.get(name="anthropic").base_url == "https://api.anthropic.com"


def test_add_provider_adds_one_as_the_api_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "x")
    call_command(
        "add_provider",
        "local-vllm",
        "--kind",
        "openai",
        "--base-url",
        "http://127.0.0.1:8000/v1",
        "--key-env",
        "VLLM_API_KEY",
    )
    assert Provider.objects.get(name="local-vllm").api_key_env == "VLLM_API_KEY"
    assert "provider 'local-vllm' added" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["p", "--kind", "openai", "--base-url", "http://169.254.169.254/"], "base_url"),
        (
            [
                "p",
                "--kind",
                "openai",
                "--base-url",
                "https://api.example.com/v1",
                "--key-env",
                "NOT_SET_ANYWHERE_API_KEY",
            ],
            "NOT_SET_ANYWHERE_API_KEY is not set",
        ),
        (
            [
                "p",
                "--kind",
                "openai",
                "--base-url",
                "https://api.example.com/v1",
                "--key-env",
                "DATABASE_URL",
            ],
            "AGENTOPS_PROVIDER_KEY_ENVS",
        ),
        (["bad name", "--kind", "openai", "--base-url", "https://api.example.com/v1"], "name:"),
    ],
)
def test_add_provider_refuses_what_the_api_refuses_naming_the_field(
    args: list[str], words: str
) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("add_provider", *args)
    assert words in str(refused.value)
    assert not Provider.objects.filter(name__in=["p", "bad name"]).exists()
