"""The core records: providers, agents, their history, API tokens and the audit trail
(architecture.md §4)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

DEFAULT_PROJECT = "default"


class Project(models.Model):
    """A tenant: API tokens belong to one, and agents to the project of the token that created
    them. A non-operator token sees only its own project's agents (API.md, Projects)."""

    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The providers the project's agents may name, once an operator granted a list
    # (``PUT /projects/{name}/providers``). Until then ``providers_granted_at`` is null and every
    # provider is granted: the projects made before grants existed keep what they could name.
    granted_providers: models.ManyToManyField[Provider, Any] = models.ManyToManyField(
        "Provider", blank=True, related_name="granted_to"
    )
    providers_granted_at = models.DateTimeField(null=True, blank=True)
    # Limits an operator sets on every call the project's agents make (architecture.md §6.14;
    # ``PUT /projects/{name}/limits``): null is no limit. Bounds in ``agentops.project_limits``.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    concurrent_calls = models.PositiveIntegerField(null=True, blank=True)
    limits_set_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


def default_project_id() -> int:
    """The ``default`` project (created by migration; created here if it was deleted)."""
    return Project.objects.get_or_create(name=DEFAULT_PROJECT)[0].pk


class Provider(models.Model):
    class Kind(models.TextChoices):
        OPENAI = "openai", "OpenAI chat-completions compatible"
        ANTHROPIC = "anthropic", "Anthropic messages"
        OPENAI_RESPONSES = "openai-responses", "OpenAI Responses API"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    base_url = models.URLField(max_length=500)
    # The name of the environment variable that holds the key: never the key itself.
    api_key_env = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # An episode of failures that say the provider is down (architecture.md §15): since when every
    # call has failed so, the last such error, and when the episode's provider-down alert went out.
    failing_since = models.DateTimeField(null=True, blank=True)
    last_failure = models.JSONField(null=True, blank=True)
    down_alerted_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


NOT_NEGATIVE = [MinValueValidator(Decimal(0))]


class Price(models.Model):
    """What a provider charges for a model, per million tokens, from ``effective_from`` on
    (architecture.md §17). A change is a new row: the rows before it keep pricing the calls
    sent while they were in force."""

    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="prices")
    model = models.CharField(max_length=200)
    # Six places: a price of 0.000001 per million is finer than any provider lists, and a
    # cost (tokens x price / 10^6) then has at most 12, which InferenceCall.cost holds exactly.
    input_per_mtok = models.DecimalField(max_digits=18, decimal_places=6, validators=NOT_NEGATIVE)
    output_per_mtok = models.DecimalField(max_digits=18, decimal_places=6, validators=NOT_NEGATIVE)
    # Null: billed at the input (cached, cache writes) or output (reasoning) price.
    cached_input_per_mtok = models.DecimalField(
        max_digits=18, decimal_places=6, null=True, blank=True, validators=NOT_NEGATIVE
    )
    cache_write_per_mtok = models.DecimalField(
        max_digits=18, decimal_places=6, null=True, blank=True, validators=NOT_NEGATIVE
    )
    reasoning_per_mtok = models.DecimalField(
        max_digits=18, decimal_places=6, null=True, blank=True, validators=NOT_NEGATIVE
    )
    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["provider", "model", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "model", "effective_from"], name="price_once_per_instant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model} on {self.provider_id} from {self.effective_from:%Y-%m-%d %H:%M}"


# A model's window in tokens, configured for an agent or an alternate: no model has less than
# 256, none more than 100 million.
CONTEXT_WINDOW_MIN = 256
CONTEXT_WINDOW_MAX = 100_000_000


class Agent(models.Model):
    class Kind(models.TextChoices):
        RESIDENT = "resident"
        CONVERSATION = "conversation"
        EPHEMERAL = "ephemeral"

    class ContextPolicy(models.TextChoices):
        """What a turn does when the history outgrows the model's window (architecture.md §5.9)."""

        TRIM = "trim"
        SUMMARIZE = "summarize"
        FAIL = "fail"

    name = models.CharField(max_length=100, unique=True)
    # Names stay globally unique (the waits journal keys on the name); the project scopes who
    # may see and act on the agent.
    # Set on save when not given: the ``default`` project (no query when an Agent is built).
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="agents")
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.RESIDENT)
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="agents")
    model = models.CharField(max_length=200)
    participant = models.CharField(max_length=100)
    system = models.TextField(blank=True, default="")
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    thinking_budget = models.PositiveIntegerField(null=True, blank=True)
    stream = models.BooleanField(default=True)
    # Tool definitions offered to the model: [{"name", "description", "input_schema"}].
    tools = models.JSONField(default=list, blank=True)
    # Alternates, in order, for a held or failing model (architecture.md §6.11):
    # [{"provider": name, "model", "context_window": tokens | null}], at most 4.
    fallbacks = models.JSONField(default=list, blank=True)
    # Members that share the agent's calls while they are healthy (architecture.md §6.15):
    # [{provider, model, weight, context_window, provider_id, kind}]; the agent's own
    # (provider, model) is a member of weight 1.
    pool = models.JSONField(default=list, blank=True)
    # When a call has produced no content after this long, the same request is also sent to
    # the first alternate free to serve; the first to answer is relayed (architecture.md
    # §6.11). Null: no hedging.
    hedge_after_ms = models.PositiveIntegerField(null=True, blank=True)
    # The model's window in tokens as configured, and as a refusal last stated it (learned): the
    # smaller known one is the one a request must fit (architecture.md §5.9).
    context_window = models.PositiveIntegerField(null=True, blank=True)
    context_learned_window = models.PositiveIntegerField(null=True, blank=True, editable=False)
    context_policy = models.CharField(
        max_length=20, choices=ContextPolicy.choices, default=ContextPolicy.TRIM
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Disposed agents keep their rows (history is never deleted) and their name.
    disposed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.project_id is None:
            self.project_id = default_project_id()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        # The admin's form checks what the API's schema and agent_update check.
        if self.context_window is not None and not (
            CONTEXT_WINDOW_MIN <= self.context_window <= CONTEXT_WINDOW_MAX
        ):
            raise ValidationError(
                {
                    "context_window": f"must be from {CONTEXT_WINDOW_MIN} to "
                    f"{CONTEXT_WINDOW_MAX:,} tokens"
                }
            )
        if self.context_window and self.max_tokens and self.context_window <= self.max_tokens:
            raise ValidationError(
                {"context_window": f"must be larger than max_tokens ({self.max_tokens})"}
            )

    @property
    def known_window(self) -> int | None:
        """The window a request must fit: the smaller of the configured and the learned one."""
        known = [w for w in (self.context_window, self.context_learned_window) if w]
        return min(known) if known else None

    def targets(self) -> list[tuple[int, str]]:
        """The (provider id, model) of the agent's own target, its pool's members and its
        stored alternates."""
        listed = [
            *(self.pool if isinstance(self.pool, list) else []),
            *(self.fallbacks if isinstance(self.fallbacks, list) else []),
        ]
        return [(self.provider_id, self.model)] + [
            (f["provider_id"], str(f.get("model")))
            for f in listed
            if isinstance(f, dict) and isinstance(f.get("provider_id"), int)
        ]


class HistoryRow(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"
        SYSTEM_NOTE = "system-note"

    class NoteKind(models.TextChoices):
        """Which of the service's own notes a system note is, as a value code reads (its text
        is for the model and a person)."""

        NONE = "", "none"
        FAILED = "failed"  # [inference-failed]: a turn's call failed (turns.notes)
        SHED = "shed"  # [refusal-rewind]: the breaker set turns aside (breaker.shedding)
        TRIM = "trim"  # [context-trim]: rows set aside to fit the window
        SUMMARY = "summary"  # [context-summary]: a summary stands for rows set aside

    class State(models.TextChoices):
        PRESENTED = "presented"
        SET_ASIDE = "set_aside"

    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="history")
    seq = models.PositiveIntegerField()
    participant = models.CharField(max_length=100)
    role = models.CharField(max_length=20, choices=Role.choices)
    note_kind = models.CharField(
        max_length=10, choices=NoteKind.choices, blank=True, default=NoteKind.NONE
    )
    # A string, or a list of blocks: text, tool_call, tool_result, thinking.
    content = models.JSONField()
    state = models.CharField(max_length=20, choices=State.choices, default=State.PRESENTED)
    set_aside_at = models.DateTimeField(null=True, blank=True)
    set_aside_by = models.CharField(max_length=220, blank=True, default="")
    set_aside_reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    edited_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["agent_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "seq"], name="history_row_seq_unique")
        ]
        verbose_name = "history row"

    def __str__(self) -> str:
        return f"{self.agent_id}#{self.seq} {self.participant} ({self.role})"


class ApiToken(models.Model):
    name = models.CharField(max_length=100)
    # sha256 of the token; the token itself is printed once and never stored.
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="tokens")
    # An operator token sees and acts on every project.
    operator = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.project_id is None:
            self.project_id = default_project_id()
        super().save(*args, **kwargs)


class AuditEntry(models.Model):
    at = models.DateTimeField(auto_now_add=True)
    actor = models.CharField(max_length=220)
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=300)
    reason = models.CharField(max_length=1000, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"


class Alert(models.Model):
    """An ops alert (architecture.md §8). Raised only through ``agentops.alerts.alert_raise``."""

    kind = models.CharField(max_length=50)
    agent = models.CharField(max_length=100)  # an agent's name, or "framework"
    model = models.CharField(max_length=200, blank=True, default="")
    verdict = models.CharField(max_length=50, blank=True, default="")
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=220, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["kind", "agent"])]
        permissions = [("acknowledge_alert", "Can acknowledge alerts")]

    def __str__(self) -> str:
        return f"{self.kind} {self.agent} {self.model}".strip()


class IdempotencyKey(models.Model):
    """A request sent with an ``Idempotency-Key`` header (architecture.md §14.2): inserted before
    any provider call, so the unique constraint on (token, key) decides which of two duplicates
    makes the call; the answer recorded here is what a repeat is given instead."""

    class Status(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"  # the answer is recorded: a repeat replays it
        UNREPLAYABLE = "unreplayable"  # answered, but too large to record

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="idempotency_keys")
    key = models.CharField(max_length=255)
    # sha256 of the endpoint and the raw body: the same key with another body is refused.
    body_hash = models.CharField(max_length=64)
    endpoint = models.CharField(max_length=300)
    agent = models.CharField(max_length=100, blank=True, default="")  # the name the request gave
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.IN_FLIGHT)
    created_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_headers = models.JSONField(default=dict, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    streamed = models.BooleanField(default=False)  # the body is the SSE bytes of a stream
    turn_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "key"], name="idempotency_key_per_token")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_key_created")]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"


class Budget(models.Model):
    """What an agent or a project may spend per calendar period (architecture.md §18), and the
    period's ledger: ``spent`` is the cost of the calls ended in it, ``reserved`` the worst
    case of the calls sent and not yet ended. Exactly one of ``agent`` and ``project``."""

    class Period(models.TextChoices):
        DAY = "day", "day"
        WEEK = "week", "week"
        MONTH = "month", "month"

    agent = models.OneToOneField(
        Agent, on_delete=models.CASCADE, null=True, blank=True, related_name="budget"
    )
    project = models.OneToOneField(
        Project, on_delete=models.CASCADE, null=True, blank=True, related_name="budget"
    )
    amount = models.DecimalField(max_digits=30, decimal_places=12)
    period = models.CharField(max_length=10, choices=Period.choices)
    warn_at = models.DecimalField(max_digits=5, decimal_places=4, default=Decimal("0.8"))
    # The start of the period the ledger counts; a call reserving past its end starts a new one.
    period_start = models.DateTimeField()
    spent = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0))
    reserved = models.DecimalField(max_digits=30, decimal_places=12, default=Decimal(0))
    # The period a warning, and a breach (the budget hold), were raised in: once per period.
    warned_period = models.DateTimeField(null=True, blank=True)
    held_period = models.DateTimeField(null=True, blank=True)
    held_at = models.DateTimeField(null=True, blank=True)
    # The period an operator released the hold in: its calls go out over the amount (still
    # reserved and counted) until the period resets or the budget is set again.
    released_period = models.DateTimeField(null=True, blank=True)
    # Which ledger a reservation was made on: bumped whenever the ledger starts again within a
    # period (a change of period starting on the same instant, a Monday's day and week), so a
    # call in flight settles on the ledger it reserved on or on none, never below 0.
    ledger = models.PositiveIntegerField(default=0)
    # The estimate of the last call this budget refused, in the period it was refused in: what
    # an operator reads beside the room left (GET .../budget).
    refused_estimate = models.DecimalField(max_digits=30, decimal_places=12, null=True, blank=True)
    refused_period = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(agent__isnull=False, project__isnull=True)
                | models.Q(agent__isnull=True, project__isnull=False),
                name="budget_of_agent_or_project",
            )
        ]

    def __str__(self) -> str:
        return f"budget {self.amount}/{self.period} of {self.agent_id or self.project_id}"
