"""AGENTOPS_INFERENCE_BOUNDS: parsing and the startup system check agentops.E001
(architecture.md §5.4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.test import override_settings

from calls.bounds import BoundsSettings
from calls.config import BoundsConfigError, check_inference_bounds, parse_bounds

BASE_DIR = Path(__file__).resolve().parents[2]
PREFIX = "AGENTOPS_INFERENCE_BOUNDS"
DEFAULTS = BoundsSettings()

# Every field, as (section, name, dotted path, unit in the message).
FIELDS = [
    (
        "progress_bounds",
        "before_content_ms",
        f"{PREFIX}.progress_bounds.before_content_ms",
        "milliseconds",
    ),
    (
        "progress_bounds",
        "between_events_ms",
        f"{PREFIX}.progress_bounds.between_events_ms",
        "milliseconds",
    ),
    (
        "progress_bounds",
        "think_tokens_per_second",
        f"{PREFIX}.progress_bounds.think_tokens_per_second",
        "tokens per second",
    ),
    ("", "flat_minimum_ms", f"{PREFIX}.flat_minimum_ms", "milliseconds"),
    ("", "absolute_ms", f"{PREFIX}.absolute_ms", "milliseconds"),
]
FIELD_IDS = [path.removeprefix(f"{PREFIX}.") for _, _, path, _ in FIELDS]


def with_field(section: str, name: str, value: Any) -> dict[str, Any]:
    return {section: {name: value}} if section else {name: value}


@pytest.mark.parametrize("raw", [False, "false", " false\n"])
def test_false_turns_every_bound_off(raw: Any) -> None:
    assert parse_bounds(raw) is None


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "   ",
        "null",
        {},
        "{}",
        {"progress_bounds": None},
        '{"progress_bounds": null}',
        {"progress_bounds": {}},
        {
            "progress_bounds": {
                "before_content_ms": None,
                "between_events_ms": None,
                "think_tokens_per_second": None,
            },
            "flat_minimum_ms": None,
            "absolute_ms": None,
        },
    ],
)
def test_a_missing_or_null_value_means_the_defaults(raw: Any) -> None:
    assert parse_bounds(raw) == DEFAULTS


@pytest.mark.parametrize(
    ("raw", "changed"),
    [
        ({"progress_bounds": {"before_content_ms": 5_000}}, {"before_content_ms": 5_000}),
        ('{"progress_bounds": {"between_events_ms": 2500.5}}', {"between_events_ms": 2_500.5}),
        ({"progress_bounds": {"think_tokens_per_second": 10}}, {"think_tokens_per_second": 10}),
        ('{"flat_minimum_ms": 9000}', {"flat_minimum_ms": 9_000}),
        ({"absolute_ms": 0.5}, {"absolute_ms": 0.5}),
        (
            {
                "progress_bounds": {"before_content_ms": 1_000, "between_events_ms": None},
                "absolute_ms": 7,
            },
            {"before_content_ms": 1_000, "absolute_ms": 7},
        ),
    ],
)
def test_a_partial_override_keeps_the_other_defaults(raw: Any, changed: dict[str, float]) -> None:
    parsed = parse_bounds(raw)
    assert parsed == BoundsSettings(**changed)
    assert parsed is not None
    for name, value in changed.items():
        assert isinstance(getattr(parsed, name), float)
        assert getattr(parsed, name) == value


# Bad values as (value, how the message shows it).
BAD_VALUES = [
    pytest.param("abc", '"abc"', id="string"),
    pytest.param("60000", '"60000"', id="numeric-string"),
    pytest.param("", '""', id="empty-string"),
    pytest.param(0, "0", id="zero"),
    pytest.param(0.0, "0.0", id="zero-float"),
    pytest.param(-1, "-1", id="negative"),
    pytest.param(-0.5, "-0.5", id="negative-float"),
    pytest.param(float("nan"), "nan", id="nan"),
    pytest.param(float("inf"), "inf", id="inf"),
    pytest.param(float("-inf"), "-inf", id="minus-inf"),
    pytest.param(True, "true", id="true"),
    pytest.param(False, "false", id="false"),
    pytest.param([1_000], "[1000]", id="list"),
    pytest.param([], "[]", id="empty-list"),
    pytest.param({"ms": 5}, '{"ms": 5}', id="object"),
]


@pytest.mark.parametrize(("value", "shown"), BAD_VALUES)
@pytest.mark.parametrize(("section", "name", "path", "unit"), FIELDS, ids=FIELD_IDS)
def test_a_bad_value_is_refused_naming_the_exact_field(
    section: str, name: str, path: str, unit: str, value: Any, shown: str
) -> None:
    with pytest.raises(BoundsConfigError) as refused:
        parse_bounds(with_field(section, name, value))
    assert str(refused.value) == f"{path} must be a positive number of {unit}, not {shown}"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"progress_bounds": {"before_content_ms": "abc"}}', '"abc"'),
        ('{"progress_bounds": {"before_content_ms": NaN}}', "nan"),
        ('{"progress_bounds": {"before_content_ms": Infinity}}', "inf"),
        ('{"progress_bounds": {"before_content_ms": -Infinity}}', "-inf"),
        ('{"progress_bounds": {"before_content_ms": 1e999}}', "inf"),
        ('{"progress_bounds": {"before_content_ms": 0}}', "0"),
        ('{"progress_bounds": {"before_content_ms": true}}', "true"),
        ('{"progress_bounds": {"before_content_ms": [5]}}', "[5]"),
    ],
)
def test_a_bad_value_in_the_environment_json_is_refused_naming_the_field(
    text: str, shown: str
) -> None:
    with pytest.raises(BoundsConfigError) as refused:
        parse_bounds(text)
    assert str(refused.value) == (
        f"{PREFIX}.progress_bounds.before_content_ms must be a positive number of milliseconds, "
        f"not {shown}"
    )


@pytest.mark.parametrize(
    ("progress_bounds", "shown"),
    [
        (5, "5"),
        ("fast", '"fast"'),
        ([], "[]"),
        ([{"before_content_ms": 1}], '[{"before_content_ms": 1}]'),
        (True, "true"),
        (False, "false"),
    ],
)
def test_a_progress_bounds_that_is_not_an_object_is_refused_naming_it(
    progress_bounds: Any, shown: str
) -> None:
    for raw in (
        {"progress_bounds": progress_bounds},
        json.dumps({"progress_bounds": progress_bounds}),
    ):
        with pytest.raises(BoundsConfigError) as refused:
            parse_bounds(raw)
        assert str(refused.value) == f"{PREFIX}.progress_bounds must be an object, not {shown}"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("abc", f"{PREFIX} must be JSON or false, not 'abc'"),
        ("False", f"{PREFIX} must be JSON or false, not 'False'"),
        ("true", f"{PREFIX} must be an object or false, not true"),
        (True, f"{PREFIX} must be an object or false, not true"),
        ("5", f"{PREFIX} must be an object or false, not 5"),
        ("[]", f"{PREFIX} must be an object or false, not []"),
        ('"x"', f'{PREFIX} must be an object or false, not "x"'),
    ],
)
def test_a_setting_that_is_not_an_object_or_false_is_refused(raw: Any, message: str) -> None:
    with pytest.raises(BoundsConfigError) as refused:
        parse_bounds(raw)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "false",
        False,
        None,
        '{"progress_bounds": {"before_content_ms": 100}, "absolute_ms": 5000}',
    ],
)
def test_the_system_check_passes_a_valid_setting(raw: Any) -> None:
    with override_settings(AGENTOPS_INFERENCE_BOUNDS=raw):
        assert check_inference_bounds() == []


@pytest.mark.parametrize(("value", "shown"), BAD_VALUES)
@pytest.mark.parametrize(("section", "name", "path", "unit"), FIELDS, ids=FIELD_IDS)
def test_the_system_check_refuses_a_bad_value_as_agentops_e001(
    section: str, name: str, path: str, unit: str, value: Any, shown: str
) -> None:
    with override_settings(AGENTOPS_INFERENCE_BOUNDS=with_field(section, name, value)):
        errors = check_inference_bounds()
    assert len(errors) == 1
    [error] = errors
    assert isinstance(error, checks.Error)
    assert error.id == "agentops.E001"
    assert error.msg == f"{path} must be a positive number of {unit}, not {shown}"


def test_the_system_check_is_registered_with_django() -> None:
    with override_settings(AGENTOPS_INFERENCE_BOUNDS={"absolute_ms": -1}):
        errors = checks.run_checks()
    assert [e.id for e in errors if e.id == "agentops.E001"] == ["agentops.E001"]


def test_an_integer_too_large_for_a_float_is_refused_naming_the_field() -> None:
    raw = '{"absolute_ms": 1' + "0" * 400 + "}"
    with override_settings(AGENTOPS_INFERENCE_BOUNDS=raw):
        errors = check_inference_bounds()
    assert [e.id for e in errors] == ["agentops.E001"]
    assert errors[0].msg.startswith(
        f"{PREFIX}.absolute_ms must be a positive number of milliseconds"
    )


def _manage_check(bounds: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        AGENTOPS_INFERENCE_BOUNDS=bounds,
        DATABASE_URL=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentops"),
        REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/3"),
    )
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_manage_py_check_refuses_a_bad_environment_value_at_startup() -> None:
    # Refused as the settings load, in every process, in one line (the system check,
    # agentops.E001, covers a value set in a settings module instead).
    result = _manage_check('{"progress_bounds": {"before_content_ms": "abc"}}')
    assert result.returncode == 2
    output = result.stdout + result.stderr
    assert output.startswith("agentops: configuration error: ")
    assert (
        "AGENTOPS_INFERENCE_BOUNDS.progress_bounds.before_content_ms must be a positive number "
        'of milliseconds, not "abc"'
    ) in output


def test_manage_py_check_accepts_false() -> None:
    result = _manage_check("false")
    assert result.returncode == 0, result.stderr
    assert "agentops.E001" not in result.stdout + result.stderr
