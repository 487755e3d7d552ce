"""The environment's settings are refused at startup with a message that names the variable."""

from __future__ import annotations

import pytest

from agentops.conf import ConfigError, env_int, env_time_zone


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("twenty", "must be a whole number"),
        ("-1", "must be at least 0"),
        ("20", "must be at most 19"),
    ],
)
def test_a_whole_number_out_of_its_range_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, raw: str, problem: str
) -> None:
    monkeypatch.setenv("AGENTOPS_BOOKKEEPING_NICE", raw)
    with pytest.raises(ConfigError, match=f"^AGENTOPS_BOOKKEEPING_NICE {problem}"):
        env_int("AGENTOPS_BOOKKEEPING_NICE", 10, maximum=19)


def test_a_whole_number_within_its_range_or_unset_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTOPS_BOOKKEEPING_NICE", "19")
    assert env_int("AGENTOPS_BOOKKEEPING_NICE", 10, maximum=19) == 19
    monkeypatch.setenv("AGENTOPS_BOOKKEEPING_NICE", " ")
    assert env_int("AGENTOPS_BOOKKEEPING_NICE", 10, maximum=19) == 10


def test_a_budget_time_zone_must_be_an_iana_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTOPS_BUDGET_TIME_ZONE", "Mars/Olympus")
    with pytest.raises(ConfigError, match=r"^AGENTOPS_BUDGET_TIME_ZONE must be an IANA"):
        env_time_zone("AGENTOPS_BUDGET_TIME_ZONE", "UTC")
    monkeypatch.setenv("AGENTOPS_BUDGET_TIME_ZONE", "Europe/Paris")
    assert env_time_zone("AGENTOPS_BUDGET_TIME_ZONE", "UTC") == "Europe/Paris"
    monkeypatch.delenv("AGENTOPS_BUDGET_TIME_ZONE")
    assert env_time_zone("AGENTOPS_BUDGET_TIME_ZONE", "UTC") == "UTC"
