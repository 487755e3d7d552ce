"""Turns and the per-call timeline rows (architecture.md §4, §5.1, §5.2)."""

from __future__ import annotations

from django.db import models

from agentops.models import Agent, HistoryRow
from inference.routes import RouteKind


class Turn(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        HELD = "held"
        REQUIRES_ACTION = "requires_action"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        EXHAUSTED = "exhausted"
        CANCELLED = "cancelled"

    OPEN = (Status.QUEUED, Status.RUNNING, Status.HELD, Status.REQUIRES_ACTION)
    JOINABLE = (Status.QUEUED, Status.HELD)
    ENDED = (Status.SUCCEEDED, Status.FAILED, Status.EXHAUSTED, Status.CANCELLED)

    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="turns")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    trigger_rows = models.ManyToManyField(HistoryRow, related_name="triggered_turns", blank=True)
    hold_until = models.DateTimeField(null=True, blank=True)
    hold_reason = models.CharField(max_length=600, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    rounds = models.PositiveIntegerField(default=0)
    # Tool calls handed out in the last round, awaiting results: [{"id", "name", "arguments"}].
    pending_tool_calls = models.JSONField(default=list, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    note = models.ForeignKey(
        HistoryRow, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Re-arm (architecture.md §5.7): how many times the turn was sent again after it was exhausted,
    # and when a queued turn may run next. A queued turn is not run before ``not_before``.
    rearms = models.PositiveIntegerField(default=0)
    not_before = models.DateTimeField(null=True, blank=True)
    # Why the turn's next call may not go before ``not_before`` (architecture.md §5.7, §6.8):
    # "pacing after a 429", "retry 2 of 3 after server error", "re-armed". Kept with the instant, so
    # whichever worker runs the turn next (after a hand-back, a crash, a release) honours it.
    waiting_reason = models.CharField(max_length=200, blank=True, default="")
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    # The turn's span while it is open, when telemetry is exported (``agentops.telemetry``:
    # its ids, parent, start, and the events and links it gathers); null otherwise.
    trace_context = models.JSONField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["agent", "status"])]

    def __str__(self) -> str:
        return f"turn {self.pk} of {self.agent.name} ({self.status})"


class InferenceCall(models.Model):
    class Kind(models.TextChoices):
        PRIMARY = "primary"
        AUXILIARY = "auxiliary"
        PROBE = "probe"

    class Outcome(models.TextChoices):
        COMPLETED = "completed"
        CUT = "cut"
        ERROR = "error"
        DEFERRED = "deferred"
        ABORTED = "aborted"

    class Bound(models.TextChoices):
        BEFORE_CONTENT = "before_content"
        BETWEEN_EVENTS = "between_events"
        FLAT = "flat"
        ABSOLUTE = "absolute"
        WHOLE_CALL = "whole_call"

    turn = models.ForeignKey(
        Turn, null=True, blank=True, on_delete=models.CASCADE, related_name="calls"
    )
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="calls")
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.PRIMARY)
    model = models.CharField(max_length=200)
    # The provider that served the call (the agent's own, or an alternate's: §6.11) and why
    # it was chosen ("primary", "fallback: held until …", "return to primary", …).
    provider = models.ForeignKey(
        "agentops.Provider", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    route = models.CharField(max_length=300, blank=True, default="")
    # The same as a value, for code to read (inference.routes).
    route_kind = models.CharField(
        max_length=16, choices=[(k.value, k.value) for k in RouteKind], default=RouteKind.PRIMARY
    )
    streamed = models.BooleanField()
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    # How long the call waited for its provider's quota before it was sent (architecture.md
    # §6.13); null when it did not wait.
    paced_ms = models.PositiveIntegerField(null=True, blank=True)
    round = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    headers_at = models.DateTimeField(null=True, blank=True)
    first_event_at = models.DateTimeField(null=True, blank=True)
    first_content_at = models.DateTimeField(null=True, blank=True)
    thinking_started_at = models.DateTimeField(null=True, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    model_events = models.PositiveIntegerField(default=0)
    keepalives = models.PositiveIntegerField(default=0)
    # Null while the call is in flight (the API shows null), distinct from any outcome.
    outcome = models.CharField(  # noqa: DJ001
        max_length=20, choices=Outcome.choices, null=True, blank=True
    )
    stop_reason = models.CharField(max_length=50, blank=True, default="")
    # Null when no bound cut the call (the API shows null).
    bound = models.CharField(  # noqa: DJ001
        max_length=20, choices=Bound.choices, null=True, blank=True
    )
    bound_deadline = models.DateTimeField(null=True, blank=True)
    cut_lateness_ms = models.FloatField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # The recorded picture of the call (calls.records.call_marks): when model events and
    # keepalives arrived, in ms after send (first 200 and last 50 of each, and how many were
    # left out between), and the bounds the call ran under. Empty while the call is in flight.
    marks = models.JSONField(default=dict, blank=True)
    # A probe's verdict once the breaker has read it (breaker.services.breaker_probe_end):
    # answered, refused, unclear, set_aside, withdrawn or aborted. Empty for other calls.
    probe_verdict = models.CharField(max_length=20, blank=True, default="")
    # Token usage as the provider reported it (calls.adapters, each format's usage);
    # null when it reported none, never 0 in its place. Input counts cached input and the
    # input written to a cache (Anthropic's cache_creation_input_tokens) too.
    input_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    output_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    reasoning_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    cached_input_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    cache_write_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    # What the call cost (calls.records, architecture.md §17), in the price's currency, with the
    # price it used: null while in flight and when it cannot be known (no price in force, or no
    # usage reported by a call that got an answer), never 0 in its place; 0 with no price for a
    # call that ended before the provider answered anything (``cost_basis`` says which).
    cost = models.DecimalField(max_digits=30, decimal_places=12, null=True, blank=True)
    price = models.ForeignKey(
        "agentops.Price", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    cost_basis = models.CharField(max_length=20, blank=True, default="")
    # The worst case the call reserved on its budgets before it was sent (architecture.md
    # §18); null when no budget counted it or its model is unpriced.
    reserved = models.DecimalField(max_digits=30, decimal_places=12, null=True, blank=True)
    # Our count of the call's input tokens when it reserved (characters over 4, agentops.estimate):
    # with the provider's count once it ends, it calibrates the next call's estimate.
    input_estimate = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "inference call"
        # The routing's read: a target's latest calls for an agent (turns.routing).
        indexes = [
            models.Index(fields=["agent", "provider", "model", "-id"], name="call_target_latest"),
            # GET /spend and the spend page read calls by when they ended.
            models.Index(fields=["ended_at"], name="call_ended_at"),
        ]

    def __str__(self) -> str:
        return f"call {self.pk} ({self.kind}, {self.model}, {self.outcome or 'in flight'})"


class AgentLease(models.Model):
    """Which worker runs the agent's turns, until when (architecture.md §5.1: one turn at a time per
    agent across all workers). Claimed and renewed with single conditional statements; a
    worker that dies stops renewing, and the lease lapses for the next one to take."""

    agent = models.OneToOneField(
        Agent, on_delete=models.CASCADE, primary_key=True, related_name="turn_lease"
    )
    owner = models.CharField(max_length=200)
    until = models.DateTimeField()

    def __str__(self) -> str:
        return f"lease of {self.agent_id} by {self.owner} until {self.until:%H:%M:%S}"
