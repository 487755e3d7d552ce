"""deploy/prometheus/ and deploy/grafana/: the alert rules and the dashboard parse, the
PrometheusRule is the plain rules file, and every metric they (and the keda overlay's held-streams
trigger) name is one a running web server's /metrics serves today, with labels and label values
the service gives it."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agentops.tokens import api_token_create
from calls.bounds import Bound
from inference.models import InferenceCall, Turn
from tests.agentops.live_asgi import asgi_server
from tests.conftest import BASE_DIR
from tests.deploy.manifests import DEPLOY, find, render, settings_data

RULES = DEPLOY / "prometheus" / "agentops-rules.yaml"
PROMETHEUS_RULE = DEPLOY / "prometheus" / "prometheusrule.yaml"
DASHBOARD = DEPLOY / "grafana" / "agentops-dashboard.json"

# PromQL words that are not metric names.
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "offset", "bool", "on", "ignoring"}


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def keda_exprs() -> list[str]:
    scaled = find(render("keda"), "ScaledObject", "agentops-worker")
    return [t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]


def all_exprs() -> list[str]:
    return rule_exprs() + dashboard_exprs() + keda_exprs()


def _blank(match: re.Match[str]) -> str:
    return " " * len(match.group(0))


def selectors(expr: str) -> Iterator[tuple[str, str]]:
    """(metric, the text of its braces or "") for every metric the expression selects."""
    # Blanked at the same length, so a match's span reads the original: string contents, range
    # and offset durations, and by/without clauses (their words are labels).
    masked = re.sub(r'"[^"]*"', lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', expr)
    masked = re.sub(r"\[[^\]]*\]|\boffset\s+\w+|\b(?:by|without)\s*\([^)]*\)", _blank, masked)
    for match in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", masked):
        name, braces, call = match.groups()
        if call or name in PROMQL_WORDS:
            continue  # a function or an aggregation, or a keyword
        yield name, expr[match.start(2) : match.end(2)] if braces else ""


def metric_names(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name, _ in selectors(expr)}


def test_the_rule_files_parse_and_the_prometheus_rule_is_the_plain_rules_file() -> None:
    plain = yaml.safe_load(RULES.read_text())
    operator = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert operator["apiVersion"] == "monitoring.coreos.com/v1"
    assert operator["kind"] == "PrometheusRule"
    assert operator["spec"] == plain
    for group in plain["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert re.fullmatch(r"Agentops[A-Z]\w+", rule["alert"])
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert rule["expr"].count("(") == rule["expr"].count(")")


def test_the_rules_cover_the_alerts_the_issue_names() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert {
        "AgentopsHoldPastAnHour",
        "AgentopsProviderDown",
        "AgentopsJournalUnreadable",
        "AgentopsBudgetExceeded",
        "AgentopsFallbackEngagedLong",
        "AgentopsCutLatenessP99High",
        "AgentopsWorkersMissing",
        "AgentopsQueueGrowing",
    } <= alerts


def test_the_dashboard_is_an_importable_grafana_dashboard_on_a_prometheus_input() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), panel["title"]


def test_the_metric_names_are_read_from_the_expressions() -> None:
    """The reader the live test below relies on finds what it must, and only that."""
    expr = (
        'sum by (kind, bound) (rate(agentops_calls_total{outcome="cut"}[5m])) '
        '- (sum(agentops_alerts_total{kind="provider-up"} offset 10m) or vector(0)) > 0'
    )
    assert metric_names([expr]) == {"agentops_calls_total", "agentops_alerts_total"}
    assert "agentops_journal_readable" in metric_names(rule_exprs())
    assert "agentops_cut_lateness_ms_bucket" in metric_names(dashboard_exprs())


# --- against a running server ---------------------------------------------------------------


def exposed_labels() -> dict[str, set[str]]:
    """Each family's label names, as interfaces/metrics.py declares them (its ``labels=``)."""
    tree = ast.parse((BASE_DIR / "interfaces" / "metrics.py").read_text())
    labels: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.endswith("MetricFamily")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            declared = next((k.value for k in node.keywords if k.arg == "labels"), None)
            names = ast.literal_eval(declared) if declared is not None else []
            labels[str(node.args[0].value)] = set(names)
    return labels


def label_values() -> dict[tuple[str, str], set[str]]:
    """The values the service gives a label, from its models and the alert kinds it raises."""
    raised = set()
    for package in ("agentops", "calls", "waits", "turns", "breaker", "interfaces", "inference"):
        for path in (BASE_DIR / package).rglob("*.py"):
            raised |= set(re.findall(r'kind="([a-z]+(?:-[a-z]+)+)"', path.read_text()))
    calls = {
        "kind": set(InferenceCall.Kind.values),
        "outcome": {*InferenceCall.Outcome.values, "in_flight"},
        "bound": {*(b.value for b in Bound), "none"},
    }
    values = {("agentops_calls", label): v for label, v in calls.items()}
    values[("agentops_turns", "status")] = set(Turn.Status.values)
    values[("agentops_alerts", "kind")] = raised
    return values


@pytest.fixture(scope="module")
def configured_server(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The web app under uvicorn with the ConfigMap's settings (behind a TLS proxy, the hosts it
    allows, JSON logs), as the web Deployment runs it."""
    env = dict(settings_data(render("small")))
    env["AGENTOPS_FAILURES_LOG"] = str(tmp_path_factory.mktemp("deploy") / "failures.log")
    yield from asgi_server("deploy-metrics", extra_env=env)


pytestmark_live = pytest.mark.django_db(transaction=True)


@pytestmark_live
def test_the_probes_answer_as_the_manifests_ask_them(configured_server: str) -> None:
    """With the ConfigMap's settings, the kubelet's requests (Host: 127.0.0.1, plain http) get
    200 from both paths: no redirect to https, no 400 for the host."""
    for path in ("/health/live", "/health/ready"):
        answer = httpx.get(f"{configured_server}{path}", headers={"Host": "127.0.0.1"}, timeout=10)
        assert answer.status_code == 200, (path, answer.status_code, answer.text)


@pytestmark_live
def test_every_metric_the_rules_dashboard_and_keda_name_is_served_by_metrics(
    configured_server: str,
) -> None:
    token = api_token_create(name="prometheus", operator=True)[1]
    # As a Prometheus in the cluster scrapes it: plain http, the Service's name as the host.
    answer = httpx.get(
        f"{configured_server}/metrics",
        headers={"Authorization": f"Bearer {token}", "Host": "agentops-web.agentops.svc"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    served: set[str] = set()
    families: dict[str, str] = {}
    for parsed in text_string_to_metric_families(answer.text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        for suffix in suffixes.get(parsed.type, [""]):
            served.add(parsed.name + suffix)
            families[parsed.name + suffix] = parsed.name
        served |= {s.name for s in parsed.samples}
    named = metric_names(all_exprs())
    assert named, "no metric found in the rules and the dashboard"
    assert named <= served, f"named but not served by /metrics: {sorted(named - served)}"

    labels = exposed_labels()
    values = label_values()
    for expr in all_exprs():
        for name, braces in selectors(expr):
            family = families[name]
            for label, op, value in re.findall(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"', braces):
                if family.endswith("_ms") and label == "le":
                    continue
                assert label in labels[family], f"{name} has no label {label}: {expr}"
                allowed = values.get((family, label))
                if allowed is not None and op != "!=":
                    for each in value.split("|"):
                        assert each in allowed, f"{name}{{{label}={each!r}}} never occurs: {expr}"
    for expr in all_exprs():
        for clause in re.findall(r"(?:by|without)\s*\(([^)]*)\)", expr):
            for label in (x.strip() for x in clause.split(",")):
                assert label == "le" or any(label in ls for ls in labels.values()), (label, expr)


def test_the_label_value_check_can_fail() -> None:
    """A kind the service never raises is caught by the check above (its values are real)."""
    assert "provider-down" in label_values()[("agentops_alerts", "kind")]
    assert "provider-downn" not in label_values()[("agentops_alerts", "kind")]
    assert "in_flight" in label_values()[("agentops_calls", "outcome")]
