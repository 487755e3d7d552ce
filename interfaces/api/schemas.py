"""Request and response shapes of API.md. Field names are the contract."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from agentops.models import CONTEXT_WINDOW_MAX, CONTEXT_WINDOW_MIN
from agentops.validation import Line, json_problem
from agentops.validation import Text as SafeText
from inference.models import InferenceCall, Turn

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def _http_url(value: str) -> str:
    if (
        not value.startswith(("http://", "https://"))
        or len(value) < 10
        or any(ch.isspace() for ch in value)
    ):
        raise ValueError("must be an http:// or https:// URL")
    return value


# Every free string goes through agentops.validation (one validator, reused by every schema).
Name = Annotated[str, Field(min_length=1, max_length=100, pattern=NAME_PATTERN)]
Label = Annotated[Line, Field(min_length=1, max_length=100)]
Text = Annotated[SafeText, Field(max_length=200_000)]
ModelName = Annotated[Line, Field(min_length=1, max_length=200)]
ContextWindow = Annotated[int, Field(ge=CONTEXT_WINDOW_MIN, le=CONTEXT_WINDOW_MAX)]
ContextPolicy = Literal["trim", "summarize", "fail"]
# Enums as enums in the OpenAPI document: the models' own choices.
TurnStatus = Turn.Status
CallKind = InferenceCall.Kind
CallOutcome = InferenceCall.Outcome
CallBound = InferenceCall.Bound


def _schema_ok(value: dict[str, Any]) -> dict[str, Any]:
    problem = json_problem(value)
    if problem:
        raise ValueError(problem)
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# Both ways, so a kind that may be created may be listed too (a narrower one answered 500).
ProviderKind = Literal["openai", "anthropic", "openai-responses"]


class ProviderIn(Strict):
    name: Name
    kind: ProviderKind
    base_url: Annotated[Line, Field(max_length=500), AfterValidator(_http_url)]
    api_key_env: (
        Annotated[str, Field(max_length=100, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None
    ) = None


class ProviderLimitOut(BaseModel):
    """A provider's limit on one model (``*``: the account), architecture.md §6.12, §6.13."""

    model: str
    remaining_requests: int | None
    remaining_tokens: int | None
    resets_at: datetime | None
    paced_until: datetime | None
    held: bool
    held_until: datetime | None
    scope: Literal["model", "provider"]


class ProviderOut(BaseModel):
    name: str
    kind: ProviderKind
    # Operator tokens only; null for any other token.
    base_url: str | None
    api_key_env: str | None


class ProviderDetailOut(ProviderOut):
    # What its headers said is left and what holds it (architecture.md §6.12, §6.13).
    limits: list[ProviderLimitOut]


class ToolIn(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Annotated[SafeText, Field(max_length=4000)] = ""
    input_schema: Annotated[dict[str, Any], AfterValidator(_schema_ok)] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


class FallbackIn(Strict):
    provider: Name
    model: ModelName
    # Larger than the agent's max_tokens too (agentops.services.fallbacks_checked).
    context_window: ContextWindow | None = None


Fallbacks = Annotated[list[FallbackIn], Field(max_length=4)]


class PoolMemberIn(Strict):
    provider: Name
    model: ModelName
    weight: Annotated[int, Field(ge=1, le=1000)] = 1
    context_window: ContextWindow | None = None


Pool = Annotated[list[PoolMemberIn], Field(max_length=8)]


# How long a call may go without content before the request is also sent to an alternate
# (architecture.md §6.11): from 100 ms to 10 minutes.
HedgeAfter = Annotated[int, Field(ge=100, le=600_000)]


class AgentIn(Strict):
    name: Name
    kind: Literal["resident", "conversation", "ephemeral"] = "resident"
    provider: Name
    model: ModelName
    participant: Label | None = None
    system: Text = ""
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    thinking_budget: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    stream: bool = True
    tools: Annotated[list[ToolIn], Field(max_length=64)] = Field(default_factory=list)
    fallbacks: Fallbacks = Field(default_factory=list)
    pool: Pool = Field(default_factory=list)
    hedge_after_ms: HedgeAfter | None = None
    context_window: ContextWindow | None = None
    # Default: trim for resident agents, fail for the others (architecture.md §5.9).
    context_policy: ContextPolicy | None = None


class AgentPatch(Strict):
    model: ModelName | None = None
    system: Text | None = None
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    fallbacks: Fallbacks | None = None
    pool: Pool | None = None
    # null turns hedging off.
    hedge_after_ms: HedgeAfter | None = None
    # null clears the configured window (the learned one, if any, still binds).
    context_window: ContextWindow | None = None
    context_policy: ContextPolicy | None = None


class ContextOut(BaseModel):
    window: int | None
    learned: int | None
    last_input_tokens: int | None
    used_fraction: float | None
    policy: ContextPolicy


class WaitOut(BaseModel):
    agent: str
    model: str
    # The alternate's provider the wait binds on; null for the agent's own provider. A scoped
    # wait's always (architecture.md §6.12), with agent "*".
    provider: str | None = None
    scope: str = "agent"
    id: str | None = None  # an operator's hold
    until: datetime | None
    reason: str
    set_at: datetime | None
    source: str


AgentStatus = Literal["idle", "queued", "running", "held", "requires_action"]


class ServingOut(BaseModel):
    provider: str
    model: str
    since: datetime | None
    reason: str
    primary_until: datetime | None
    primary_held: bool


class ServedBy(BaseModel):
    provider: str | None
    model: str


class PoolMemberOut(BaseModel):
    """A pool member as it stands (architecture.md §6.15); the agent's own target first."""

    provider: str
    model: str
    weight: int
    calls_last_hour: int
    errors_last_hour: int
    # The share (0..1) of its requests its provider last said is left; null: not said.
    remaining: float | None
    paced_until: datetime | None
    held_until: datetime | None
    held: bool
    down_until: datetime | None


class AgentOut(BaseModel):
    name: str
    project: str
    kind: Literal["resident", "conversation", "ephemeral"]
    provider: str
    model: str
    participant: str
    system: str
    max_tokens: int | None
    thinking_budget: int | None
    stream: bool
    tools: list[dict[str, Any]]
    fallbacks: list[dict[str, Any]]
    pool: list[PoolMemberOut]
    hedge_after_ms: int | None
    serving: ServingOut | None
    status: AgentStatus
    failure_streak: int
    holds: list[WaitOut]
    current_turn: int | None
    created_at: datetime
    context: ContextOut


class HistoryRowOut(BaseModel):
    id: int
    seq: int
    participant: str
    role: str
    content: Any
    state: str
    set_aside_at: datetime | None
    set_aside_reason: str
    created_at: datetime


class MessageIn(Strict):
    participant: Label
    content: Annotated[SafeText, Field(min_length=1, max_length=200_000)]


class TurnIn(Strict):
    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=100)]


class TurnAccepted(BaseModel):
    id: int
    status: TurnStatus
    joined: bool


class ToolResultIn(Strict):
    tool_call_id: ModelName
    content: Text


class ToolResultsIn(Strict):
    results: Annotated[list[ToolResultIn], Field(min_length=1, max_length=64)]


class CallError(BaseModel):
    type: str
    http_status: int | None
    provider_code: str | None
    message: str
    retryable: bool
    retry_after_ms: float | None
    # A context-length refusal's stated window (architecture.md §5.6); null otherwise.
    context_limit: int | None = None


class CallUsage(BaseModel):
    input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    cached_input_tokens: int | None
    cache_write_tokens: int | None


class CallOut(BaseModel):
    id: int
    kind: CallKind
    model: str
    # The provider that served the call and why it was chosen (architecture.md §6.11).
    provider: str | None
    route: str
    route_kind: Literal["primary", "fallback", "returning", "hedge", "pool"]
    streamed: bool
    sent_at: datetime | None
    first_event_at: datetime | None
    first_content_at: datetime | None
    last_event_at: datetime | None
    ended_at: datetime | None
    model_events: int
    keepalives: int
    outcome: CallOutcome | None
    bound: CallBound | None
    bound_deadline: datetime | None
    cut_lateness_ms: float | None
    error: CallError | None
    usage: CallUsage
    # A decimal string in the prices' currency; null while in flight or when unknown (no price
    # in force, usage unreported): never 0 in its place. cost_basis says which (API.md).
    cost: str | None
    cost_basis: str | None
    price_id: int | None
    next_deadline: datetime | None = None
    next_bound: CallBound | None = None


class TurnOutput(BaseModel):
    content: str
    stop_reason: str
    tool_calls: list[dict[str, Any]]


class TurnOut(BaseModel):
    id: int
    agent: str
    status: TurnStatus
    held_until: datetime | None
    hold_reason: str
    # Why the next call waits (pacing after a 429, a retry delay, a re-arm), and until when.
    waiting_until: datetime | None
    waiting_reason: str | None
    attempts: int
    rounds: int
    output: TurnOutput | None
    note: str | None
    error: CallError | None
    pending_tool_calls: list[dict[str, Any]]
    calls: list[CallOut]
    # The sum of its ended calls' costs; null when any of them has no cost.
    cost: str | None
    # The provider and model of the turn's latest call (null before its first).
    served_by: ServedBy | None
    created_at: datetime
    ended_at: datetime | None


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    database: bool
    redis: bool
    journal_readable: bool
    workers: int


class ErrorOut(BaseModel):
    code: str
    message: str
    data: dict[str, Any]


# The error answers every route may give, in the OpenAPI document.
ERRORS: dict[int, type] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    413: ErrorOut,
}


class RestoreIn(Strict):
    requester: Annotated[Line, Field(max_length=1000)] | None = None
    reason: Annotated[Text, Field(max_length=1000)] | None = None


class CompleteIn(Strict):
    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=100)]
    model: ModelName | None = None
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class CompleteOut(BaseModel):
    content: str
    stop_reason: str
    call: CallOut
