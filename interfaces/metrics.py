"""``GET /metrics``: Prometheus text, computed from the database at scrape time (API.md).

Nothing is counted in process memory: the service runs as several web and worker processes,
and a scrape reaches only one of them, so every number is read from the shared rows. The
counters are counts of rows that are never deleted (history and calls are kept), so they only
go up. Each scrape costs a fixed handful of GROUP BY queries whatever the number of rows, plus
the provider-waits journal's own read.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agentops.models import Alert
from agentops.tokens import api_token_check
from agentops.webhooks.models import WebhookAttempt, WebhookDelivery
from calls.pacing import Pacer
from inference.models import InferenceCall, Turn
from interfaces.edge import runtime_of
from waits.clock import clock_ms
from waits.selectors import binding_waits

# The token counts of a call row (``<type>_tokens``), as the ``type`` label of agentops_tokens.
TOKEN_TYPES: tuple[str, ...] = ("input", "output", "reasoning", "cached_input", "cache_write")
CUT_LATENESS_BUCKETS_MS: tuple[float, ...] = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)

IN_FLIGHT = "in_flight"  # the outcome label of a call that has none yet
NO_BOUND = "none"  # the bound label of a call no bound cut
PROBE_PENDING = "pending"  # the verdict label of a probe out, or one whose verdict was never read
# The attempt outcomes that end a round of a delivery's attempts, as the delivery's result.
WEBHOOK_RESULT_OF_OUTCOME = {
    WebhookAttempt.Outcome.DELIVERED: WebhookDelivery.Status.DELIVERED,
    WebhookAttempt.Outcome.FAILED: WebhookDelivery.Status.FAILED,
    WebhookAttempt.Outcome.REFUSED: WebhookDelivery.Status.FAILED,
    WebhookAttempt.Outcome.GAVE_UP: WebhookDelivery.Status.GAVE_UP,
}


class DatabaseCollector(Collector):
    """Yields agentops' metric families from the rows as they are when ``collect`` runs."""

    def __init__(self, pacer: Pacer, *, now_ms: float) -> None:
        self.pacer = pacer  # what this process's pacer reads of the providers' quota headers
        self.now_ms = now_ms

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        yield from self._calls()
        yield self._tokens()
        yield self._spend()
        yield self._probes()
        yield self._cut_lateness()
        yield from self._waits()
        yield self._turns()
        yield self._alerts()
        yield from self._webhook_deliveries()
        yield from self._provider_limits()

    def _provider_limits(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Calls by the target that served them, those that waited for their provider's
        quota, and what each provider's remaining-quota headers last said (architecture.md
        §6.13, §6.15): one statement, and Redis for the quotas."""
        targets = CounterMetricFamily(
            "agentops_target_calls",
            "Inference calls by the provider and model that served them (a pool's member, an "
            "alternate) and outcome (in_flight while running).",
            labels=["provider", "model", "outcome"],
        )
        paced = CounterMetricFamily(
            "agentops_calls_paced",
            "Calls that waited for their provider's quota before they were sent, by provider.",
            labels=["provider"],
        )
        waited: dict[str, int] = {}
        for provider, model, outcome, n, n_paced in (
            InferenceCall.objects.values_list("provider__name", "model", "outcome")
            .annotate(n=Count("id"), paced=Count("id", filter=Q(paced_ms__isnull=False)))
            .order_by()
        ):
            targets.add_metric([provider or "", model, outcome or IN_FLIGHT], float(n))
            waited[provider or ""] = waited.get(provider or "", 0) + n_paced
        for provider, n in sorted(waited.items()):
            paced.add_metric([provider], float(n))
        yield targets
        yield paced
        remaining = GaugeMetricFamily(
            "agentops_provider_remaining",
            "What a provider's remaining-quota headers last said is left, by model and kind "
            "(requests or tokens), as every process shares it.",
            labels=["provider", "model", "kind"],
        )
        for provider in sorted(p for p in waited if p):
            for state in self.pacer.limits(provider):
                for kind, field in (("requests", "rr"), ("tokens", "tr")):
                    if state.get(field) not in (None, ""):
                        remaining.add_metric(
                            [provider, str(state["model"]), kind], float(str(state[field]))
                        )
        yield remaining

    def _calls(self) -> Iterator[CounterMetricFamily]:
        calls = CounterMetricFamily(
            "agentops_calls",
            "Inference calls by kind, outcome (in_flight while running) "
            "and the bound that cut them (none if no bound did).",
            labels=["kind", "outcome", "bound"],
        )
        deferred = 0
        rows = InferenceCall.objects.values_list("kind", "outcome", "bound").annotate(n=Count("id"))
        for kind, outcome, bound, n in rows:
            calls.add_metric([kind, outcome or IN_FLIGHT, bound or NO_BOUND], n)
            if kind == InferenceCall.Kind.AUXILIARY and outcome == InferenceCall.Outcome.DEFERRED:
                deferred += n
        yield calls
        yield CounterMetricFamily(
            "agentops_auxiliary_deferred",
            "Auxiliary calls deferred because the agent's model was held by a provider wait.",
            value=deferred,
        )

    def _tokens(self) -> CounterMetricFamily:
        tokens = CounterMetricFamily(
            "agentops_tokens",
            "Tokens the providers reported, by agent, model, call kind and type "
            "(input, output, reasoning, cached_input, cache_write); calls that reported none add nothing.",
            labels=["agent", "model", "kind", "type"],
        )
        sums = {kind: Sum(f"{kind}_tokens") for kind in TOKEN_TYPES}
        rows = (
            InferenceCall.objects.values("agent__name", "model", "kind")
            .annotate(**sums)
            .order_by("agent__name", "model", "kind")
        )
        for row in rows:
            for kind in TOKEN_TYPES:
                if row[kind] is not None:
                    tokens.add_metric(
                        [row["agent__name"], row["model"], row["kind"], kind], row[kind]
                    )
        return tokens

    def _spend(self) -> CounterMetricFamily:
        # Only calls with a cost: an unpriced call adds nothing here (never a 0 that reads as
        # free); GET /spend counts them as unpriced_calls.
        spend = CounterMetricFamily(
            "agentops_spend",
            "What the ended calls cost, in the prices' currency (unpriced calls left out).",
            labels=["project", "model"],
        )
        rows = (
            InferenceCall.objects.filter(cost__isnull=False)
            .values_list("agent__project__name", "model")
            .annotate(total=Sum("cost"))
            .order_by("agent__project__name", "model")
        )
        for project, model, total in rows:
            spend.add_metric([project, model], float(total))
        return spend

    def _probes(self) -> CounterMetricFamily:
        probes = CounterMetricFamily(
            "agentops_probes",
            "Breaker probes by verdict "
            "(answered, refused, unclear, set_aside, withdrawn, aborted; pending until read).",
            labels=["verdict"],
        )
        rows = (
            InferenceCall.objects.filter(kind=InferenceCall.Kind.PROBE)
            .values_list("probe_verdict")
            .annotate(n=Count("id"))
        )
        for verdict, n in rows:
            probes.add_metric([verdict or PROBE_PENDING], n)
        return probes

    def _cut_lateness(self) -> HistogramMetricFamily:
        at_most = {
            f"le{i}": Count("id", filter=Q(cut_lateness_ms__lte=b))
            for i, b in enumerate(CUT_LATENESS_BUCKETS_MS)
        }
        totals = InferenceCall.objects.filter(
            outcome=InferenceCall.Outcome.CUT, cut_lateness_ms__isnull=False
        ).aggregate(count=Count("id"), sum=Sum("cut_lateness_ms"), **at_most)
        buckets = [
            (floatToGoString(b), float(totals[f"le{i}"]))
            for i, b in enumerate(CUT_LATENESS_BUCKETS_MS)
        ]
        buckets.append(("+Inf", float(totals["count"])))
        return HistogramMetricFamily(
            "agentops_cut_lateness_ms",
            "How long after its bound's deadline a cut call was cut, in milliseconds.",
            buckets=buckets,
            sum_value=float(totals["sum"] or 0.0),
        )

    def _waits(self) -> Iterator[GaugeMetricFamily]:
        readable, waits = binding_waits(now_ms=self.now_ms, fresh=False)
        yield GaugeMetricFamily(
            "agentops_holds_binding",
            "Provider waits binding now "
            "(while the journal is unreadable, one per agent held on model *).",
            value=len(waits),
        )
        yield GaugeMetricFamily(
            "agentops_journal_readable",
            "1 if the provider-waits journal reads, 0 if it does not "
            "(no provider call is admitted then).",
            value=1 if readable else 0,
        )

    def _turns(self) -> GaugeMetricFamily:
        counts = {status: 0 for status in Turn.Status.values}
        for status, n in Turn.objects.values_list("status").annotate(n=Count("id")):
            counts[status] = n
        turns = GaugeMetricFamily("agentops_turns", "Turns by status.", labels=["status"])
        for status, n in counts.items():
            turns.add_metric([status], n)
        return turns

    def _alerts(self) -> CounterMetricFamily:
        alerts = CounterMetricFamily(
            "agentops_alerts", "Ops alerts raised, by kind.", labels=["kind"]
        )
        for kind, n in Alert.objects.values_list("kind").annotate(n=Count("id")):
            alerts.add_metric([kind], n)
        return alerts

    def _webhook_deliveries(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        # Counted from attempts, not from deliveries' status: a resend takes a finished delivery
        # back to pending, which would make a count of statuses step back. An attempt row is only
        # ever added, and its outcome is written once when it ends, so a round of attempts that
        # ends adds one to its result for good (a resend's round adds another).
        results = {
            status: 0
            for status in WebhookDelivery.Status.values
            if status != WebhookDelivery.Status.PENDING
        }
        ended = (
            WebhookAttempt.objects.filter(outcome__in=list(WEBHOOK_RESULT_OF_OUTCOME))
            .values_list("outcome")
            .annotate(n=Count("id"))
        )
        for outcome, n in ended:
            results[WEBHOOK_RESULT_OF_OUTCOME[outcome]] += n
        finished = CounterMetricFamily(
            "agentops_webhook_deliveries",
            "Webhook delivery rounds that ended (a resend starts another), "
            "by result (delivered, failed, gave_up).",
            labels=["result"],
        )
        for result, n in results.items():
            finished.add_metric([result], n)
        yield finished
        pending = WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING).count()
        yield GaugeMetricFamily(
            "agentops_webhook_deliveries_pending",
            "Webhook deliveries waiting for an attempt now.",
            value=pending,
        )


@csrf_exempt  # no cookie is read: a POST is answered 405 by the method check, not 403
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus scrape target. Its labels name every project's agents and models, so it
    takes an operator token (Prometheus' ``authorization`` with a bearer credential) unless
    ``AGENTOPS_METRICS_PUBLIC``."""
    if not settings.AGENTOPS_METRICS_PUBLIC:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        token = (
            api_token_check(presented.strip())
            if scheme.lower() == "bearer" and presented.strip()
            else None
        )
        if token is None or not token.operator:
            refused = HttpResponse(
                "metrics need an operator API token: Authorization: Bearer <token> "
                "(or AGENTOPS_METRICS_PUBLIC=true)\n",
                status=401 if token is None else 403,
                content_type="text/plain; charset=utf-8",
            )
            refused["WWW-Authenticate"] = "Bearer"
            return refused
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(runtime_of(request).pacer, now_ms=clock_ms()))
    # The classic text format, which every Prometheus reads (our names need none of 1.0.0's
    # escaping).
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
