"""Django settings for agentops. Every value comes from the environment (architecture.md §10)."""

from __future__ import annotations

import math
from pathlib import Path

import dj_database_url
from psycopg_pool import base as psycopg_pool_base

from .conf import (
    ABSOLUTE_MS_DEFAULT,
    ConfigError,
    bounds_values,
    env_bool,
    env_choice,
    env_int,
    env_ms,
    env_ms_list,
    env_str,
    env_time_zone,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Admin sessions and CSRF tokens are signed with it: a published default would let anyone
# forge them. `make run`/`make test` keep a random one under var/ (devtools.launcher).
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if not SECRET_KEY.strip() or SECRET_KEY.strip() in ("change-me", "agentops-dev-only-not-secret"):
    raise ConfigError(
        "DJANGO_SECRET_KEY must be set to a long random value, not "
        f"{'left empty' if not SECRET_KEY.strip() else repr(SECRET_KEY)} "
        "(admin sessions are signed with it); make one with: "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))' (agentops.E002)"
    )
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [
    h
    for h in env_str("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")
    if h
]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",
    "agentops",
    "inference",
    "calls",
    "waits",
    "breaker",
    "agentops.webhooks",
    "interfaces",
]

# Django's stock middleware, as interfaces.edge adapts it to run without a thread hop per step.
MIDDLEWARE = [
    "interfaces.edge.LoopSecurityMiddleware",
    "interfaces.edge.BrowserSessionMiddleware",
    "interfaces.edge.LoopCommonMiddleware",
    "interfaces.edge.LoopCsrfViewMiddleware",
    "interfaces.edge.BrowserAuthenticationMiddleware",
    "interfaces.edge.BrowserMessageMiddleware",
    "interfaces.edge.LoopXFrameOptionsMiddleware",
    "interfaces.edge.api_edge_middleware",
]

# Django's deploy checks look for its own dotted paths; the edge's are its subclasses, which
# agentops.checks (E003) requires in their place.
SILENCED_SYSTEM_CHECKS = ["security.W001", "security.W002", "security.W003"]

ROOT_URLCONF = "interfaces.urls"
ASGI_APPLICATION = "interfaces.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Project-level templates: DIRS are searched before the apps' own, so the admin's
        # overrides (templates/admin/) win over django.contrib.admin's templates.
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", "postgres:///agentops")
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
except ValueError as exc:  # an unknown scheme, a URL that does not parse
    raise ConfigError(f"DATABASE_URL is not a database URL Django can use ({exc})") from None
# Workers run turns on threads; a pool caps the connections a process opens however many
# turns it holds (each turn gives its connection back while its call runs).
DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
    "min_size": 1,
    "max_size": env_int("AGENTOPS_DB_POOL_SIZE", 10, minimum=1),
    # How long a query waits for a connection (psycopg_pool raises PoolTimeout, an
    # OperationalError, past it). With the database down every query waits this long, so it
    # is what bounds "the journal cannot be read, fail closed" (architecture.md §6.5).
    "timeout": env_ms("AGENTOPS_DB_POOL_TIMEOUT_MS", 10_000) / 1000,
}
# A pooled connection is checked before it is handed out, so the first query after the
# database restarts gets a fresh connection, not the dead one (an error for nothing).
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Parameters travel apart from the statement, and a statement a connection has run 5 times is
# prepared: a turn's ~25 statements are the same few texts every time, and PostgreSQL parsing
# and planning each one again cost more than running it (docs/performance.md, "Prepared
# statements").
# Off for a pooler in front of PostgreSQL that cannot keep prepared statements (PgBouncer in
# transaction mode before 1.21): statements are then bound into their text, as Django does.
if env_bool("AGENTOPS_DB_PREPARED_STATEMENTS", True):
    DATABASES["default"]["OPTIONS"].setdefault("server_side_binding", True)
    DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", 5)
# The web process answers 503 when the database is down, fast: a request waits for a
# connection at most this long (well under the workers' pool timeout), and a connection
# attempt gives up after AGENTOPS_DB_CONNECT_TIMEOUT_S.
AGENTOPS_PROCESS_ROLE = env_str("AGENTOPS_PROCESS_ROLE", "")
AGENTOPS_WEB_DB_TIMEOUT_MS = env_ms("AGENTOPS_WEB_DB_TIMEOUT_MS", 1_000)
DATABASES["default"]["OPTIONS"].setdefault(
    "connect_timeout", env_int("AGENTOPS_DB_CONNECT_TIMEOUT_S", 2, minimum=1)
)
if AGENTOPS_PROCESS_ROLE == "web":
    _pool = DATABASES["default"]["OPTIONS"]["pool"]
    _pool["timeout"] = min(_pool["timeout"], AGENTOPS_WEB_DB_TIMEOUT_MS / 1000)
    DATABASES["default"]["OPTIONS"]["connect_timeout"] = 1
# Reconnecting after an outage: the pool tries again every fifth of a second or so instead of
# doubling its delay (1, 2, 4, 8 s ...), so work resumes within about a second of the
# database being back (issue: turns resumed only when their lease lapsed).
psycopg_pool_base.AttemptWithBackoff.INITIAL_DELAY = 0.2
psycopg_pool_base.AttemptWithBackoff.DELAY_BACKOFF = 1.0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "agentops.live.ChannelLayer",
        # A socket timeout longer than the layer's blocking pop (channels_redis waits 5 s per
        # BZPOPMIN): redis-py 8's default, also 5 s, made every idle consumer's receive raise
        # TimeoutError and close the socket with a traceback.
        # The pool holds one connection per socket's group work at once; sized past the
        # dashboard sockets a process keeps (AGENTOPS_DASHBOARD_SOCKETS), plus the turns'.
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": 15, "max_connections": 500}],
            "prefix": "agentops-ch",
        },
    }
}

# Behind a TLS-terminating proxy (AGENTOPS_BEHIND_TLS_PROXY=true, as docker-compose.yml
# expects in production): the proxy's X-Forwarded-Proto says the request was https, cookies are
# sent over https only, plain http is redirected (health probes excepted) and HSTS is on.
if env_bool("AGENTOPS_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^health(/|$)", r"^metrics$"]
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("AGENTOPS_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("AGENTOPS_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("AGENTOPS_HSTS_PRELOAD", False)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
FORMAT_MODULE_PATH = ["agentops.formats"]  # instants to the second in the admin
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"

# Request bodies read whole (the API's JSON, a form's fields): anything bigger is refused with
# a 413 before it is parsed. A multipart body's file parts are not counted (Django spools them).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("AGENTOPS_MAX_BODY_BYTES", 1_048_576, minimum=1024)

# --- agentops (architecture.md §10) -------------------------------------------------
AGENTOPS_DEADLINE_RETRY_DELAY_MS = env_ms("AGENTOPS_DEADLINE_RETRY_DELAY_MS", 1000)
AGENTOPS_WAIT_ALERT_MS = env_ms("AGENTOPS_WAIT_ALERT_MS", 3_600_000)
# Budgets (architecture.md §18): the time zone their day, week and month follow, and the
# output a call without max_tokens is assumed to reserve (it has no bound of its own).
AGENTOPS_BUDGET_TIME_ZONE = env_time_zone("AGENTOPS_BUDGET_TIME_ZONE", "UTC")
# A call that fits its budget once the calls in flight settle is called again after this (§18.1).
AGENTOPS_BUDGET_BUSY_RETRY_MS = env_ms("AGENTOPS_BUDGET_BUSY_RETRY_MS", 1000)
AGENTOPS_BUDGET_DEFAULT_MAX_TOKENS = env_int(
    "AGENTOPS_BUDGET_DEFAULT_MAX_TOKENS", 4096, minimum=1, maximum=10_000_000
)
# A call reserves its likely cost (its input estimated at four characters a token, calibrated by
# the provider's last count) times 1 + this/100: the share an estimate may run under (§18.1).
AGENTOPS_BUDGET_MARGIN_PERCENT = env_int(
    "AGENTOPS_BUDGET_MARGIN_PERCENT", 25, minimum=0, maximum=1000
)
# A budgeted call to a model with no price in force: refused (it cannot be bounded), or sent
# unbounded (``allow``: its spend is not counted).
AGENTOPS_BUDGET_UNPRICED = env_choice("AGENTOPS_BUDGET_UNPRICED", "refuse", ("refuse", "allow"))
AGENTOPS_WAIT_RECHECK_MS = env_ms("AGENTOPS_WAIT_RECHECK_MS", 30_000)
# Alternates (architecture.md §6.11): a primary held longer than this is served from an
# alternate (a shorter wait is waited out, by a drop-in request too, which calls again rather
# than answer 429); a target that failed is passed over for the second one, then tried once.
AGENTOPS_FALLBACK_AFTER_MS = env_ms("AGENTOPS_FALLBACK_AFTER_MS", 30_000)
AGENTOPS_FALLBACK_RETRY_PRIMARY_MS = env_ms("AGENTOPS_FALLBACK_RETRY_PRIMARY_MS", 30_000)
# A return to the primary after an alternate served gets this long for its first content (not
# the before-content bound's minute): a primary still silent costs this once per interval.
AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS = env_ms(
    "AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS", 10_000
)
# A provider's limit at its own scope (architecture.md §6.12, §6.13): the seeds' acceleration
# cooldown on the whole account, how held turns spread out when a scoped wait ends with no
# known rate, and how long a drop-in request waits for its provider's quota to come back.
AGENTOPS_ACCELERATION_COOLDOWN_MS = env_ms("AGENTOPS_ACCELERATION_COOLDOWN_MS", 65_000)
AGENTOPS_ACCELERATION_JITTER_MS = env_ms("AGENTOPS_ACCELERATION_JITTER_MS", 5_000)
AGENTOPS_RESUME_SPREAD_MS = env_ms("AGENTOPS_RESUME_SPREAD_MS", 2_000)
AGENTOPS_DROPIN_MAX_WAIT_MS = env_ms("AGENTOPS_DROPIN_MAX_WAIT_MS", 10_000)
# The window a project's "per minute" limits count over (architecture.md §6.14), in seconds:
# a minute; shorter only in tests, where a window must pass in seconds.
AGENTOPS_PROJECT_LIMIT_WINDOW_S = env_int(
    "AGENTOPS_PROJECT_LIMIT_WINDOW_S", 60, minimum=1, maximum=3600
)
# In-flight calls' live progress (counts, nearest deadline) goes out at most this often per process.
AGENTOPS_PROGRESS_INTERVAL_MS = env_ms("AGENTOPS_PROGRESS_INTERVAL_MS", 250)
AGENTOPS_EPHEMERAL_MAX_SLEEP_MS = env_ms("AGENTOPS_EPHEMERAL_MAX_SLEEP_MS", 600_000)
AGENTOPS_BREAKER_THRESHOLD = env_int("AGENTOPS_BREAKER_THRESHOLD", 3, minimum=1)
AGENTOPS_BREAKER_SHED_CAP = env_int("AGENTOPS_BREAKER_SHED_CAP", 3, minimum=1)
# The model's window (architecture.md §5.9): what an act leaves free, as a percentage of the
# window, and what it keeps for the answer when the agent sets no max_tokens.
AGENTOPS_CONTEXT_MARGIN_PERCENT = env_int("AGENTOPS_CONTEXT_MARGIN_PERCENT", 20, maximum=90)
AGENTOPS_CONTEXT_OUTPUT_RESERVE = env_int("AGENTOPS_CONTEXT_OUTPUT_RESERVE", 4096, minimum=1)
AGENTOPS_ALERT_WEBHOOK_COOLDOWN_MS = env_ms("AGENTOPS_ALERT_WEBHOOK_COOLDOWN_MS", 900_000)
AGENTOPS_FAILURES_LOG = env_str("AGENTOPS_FAILURES_LOG", str(BASE_DIR / "var" / "failures.log"))
# The raw value (JSON, or false), refused here at every process's start when it does not
# read (architecture.md §5.4); calls.config turns it into the bounds.
AGENTOPS_INFERENCE_BOUNDS = env_str("AGENTOPS_INFERENCE_BOUNDS", "")
# The absolute call bound: its default (calls.bounds) when unset, and when bounds are off.
_ABSOLUTE_BOUND_MS = (bounds_values(AGENTOPS_INFERENCE_BOUNDS) or {}).get(
    "absolute_ms", ABSOLUTE_MS_DEFAULT
)
# How long a worker may hold one turn, at most: the absolute bound plus the retry episode.
AGENTOPS_RETRY_EPISODE_MS = env_ms("AGENTOPS_RETRY_EPISODE_MS", 20 * 60_000)
AGENTOPS_TURN_SWEEP_S = env_ms("AGENTOPS_TURN_SWEEP_MS", 15_000) / 1000
# The service's own pacing after a 429 that states no wait: at least this, plus up to half again.
AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS = env_ms("AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS", 60_000)
# A turn exhausted by a transient failure is sent again after each of these (architecture.md §5.7).
AGENTOPS_REARM_DELAYS_MS = env_ms_list("AGENTOPS_REARM_DELAYS_MS", (120_000, 480_000, 1_920_000))

# --- webhooks (architecture.md §8) ---------------------------------------------------
# Tests point endpoints at a loopback receiver; production refuses private addresses.
AGENTOPS_WEBHOOKS_ALLOW_PRIVATE = env_bool("AGENTOPS_WEBHOOKS_ALLOW_PRIVATE", False)
AGENTOPS_WEBHOOK_TIMEOUT_MS = env_ms("AGENTOPS_WEBHOOK_TIMEOUT_MS", 10_000)
# Retries wait base * 2^(attempt-1), capped at the max, plus up to half again of jitter; a
# receiver's retry-after is honoured up to the same cap.
AGENTOPS_WEBHOOK_RETRY_BASE_MS = env_ms("AGENTOPS_WEBHOOK_RETRY_BASE_MS", 5_000)
AGENTOPS_WEBHOOK_RETRY_MAX_MS = env_ms("AGENTOPS_WEBHOOK_RETRY_MAX_MS", 30 * 60_000)
AGENTOPS_WEBHOOK_MAX_ATTEMPTS = env_int("AGENTOPS_WEBHOOK_MAX_ATTEMPTS", 12, minimum=1)
AGENTOPS_WEBHOOK_SWEEP_S = env_ms("AGENTOPS_WEBHOOK_SWEEP_MS", 30_000) / 1000

# Dashboard sockets one web process holds open; past it a new one is closed with 4429.
AGENTOPS_DASHBOARD_SOCKETS = env_int("AGENTOPS_DASHBOARD_SOCKETS", 100, minimum=1)
# /metrics names every project's agents and models: an operator token unless this is true.
AGENTOPS_METRICS_PUBLIC = env_bool("AGENTOPS_METRICS_PUBLIC", False)

# --- providers (API.md, Providers) -----------------------------------------
# The models of the agents `make run` makes on the real providers whose key is set.
AGENTOPS_DEMO_OPENAI_MODEL = env_str("AGENTOPS_DEMO_OPENAI_MODEL", "gpt-5-mini")
AGENTOPS_DEMO_ANTHROPIC_MODEL = env_str("AGENTOPS_DEMO_ANTHROPIC_MODEL", "claude-haiku-4-5")
# Provider URLs that resolve to private or loopback addresses (the stand-in, a local model
# server) are refused unless this is set; link-local, multicast, reserved, unspecified and
# cloud-metadata addresses are refused always.
AGENTOPS_PROVIDERS_ALLOW_PRIVATE = env_bool("AGENTOPS_PROVIDERS_ALLOW_PRIVATE", False)
# Comma-separated patterns (fnmatch) of the environment variables a provider may read its key
# from; unset or empty: names ending in _API_KEY.
AGENTOPS_PROVIDER_KEY_ENVS = env_str("AGENTOPS_PROVIDER_KEY_ENVS", "*_API_KEY")
# The provider edge (architecture.md §15): what is read of a provider's answer, in bytes after
# decoding. Past a limit the call fails as a provider error naming it; an error body past its
# limit is read no further (only a bounded part of it is kept anyway).
AGENTOPS_PROVIDER_MAX_BODY_BYTES = env_int(
    "AGENTOPS_PROVIDER_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024
)
AGENTOPS_PROVIDER_MAX_STREAM_BYTES = env_int(
    "AGENTOPS_PROVIDER_MAX_STREAM_BYTES", 128 * 1024 * 1024, minimum=1024
)
AGENTOPS_PROVIDER_MAX_LINE_BYTES = env_int(
    "AGENTOPS_PROVIDER_MAX_LINE_BYTES", 1024 * 1024, minimum=1024
)
# One event of a stream: its ``data:`` lines together (a stream of them with no blank line
# between is one event that never ends).
AGENTOPS_PROVIDER_MAX_EVENT_BYTES = env_int(
    "AGENTOPS_PROVIDER_MAX_EVENT_BYTES", 1024 * 1024, minimum=1024
)
AGENTOPS_PROVIDER_MAX_ERROR_BODY_BYTES = env_int(
    "AGENTOPS_PROVIDER_MAX_ERROR_BODY_BYTES", 4 * 1024 * 1024, minimum=1024
)
# What is kept of one completed answer (its text, thinking and tool-call arguments, as stored
# in the turn and answered by the API): past it the call fails naming this, rather than a 50 MB
# tool-call argument being stored whole and answered by every read of the turn.
AGENTOPS_PROVIDER_MAX_ANSWER_BYTES = env_int(
    "AGENTOPS_PROVIDER_MAX_ANSWER_BYTES", 4 * 1024 * 1024, minimum=1024
)
# The header section (aiohttp's own limits): how many headers, and the longest header line.
AGENTOPS_PROVIDER_MAX_HEADERS = env_int("AGENTOPS_PROVIDER_MAX_HEADERS", 128, minimum=16)
AGENTOPS_PROVIDER_MAX_HEADER_BYTES = env_int(
    "AGENTOPS_PROVIDER_MAX_HEADER_BYTES", 8190, minimum=1024
)
AGENTOPS_PROVIDER_CONNECT_TIMEOUT_MS = env_ms("AGENTOPS_PROVIDER_CONNECT_TIMEOUT_MS", 30_000)
# A provider whose calls have all failed with network, TLS, auth or 5xx errors for this long,
# with no success, raises one provider-down alert per episode.
AGENTOPS_PROVIDER_DOWN_AFTER_MS = env_ms("AGENTOPS_PROVIDER_DOWN_AFTER_MS", 300_000)
# A drop-in 429 for a wait longer than this tells the client's SDK not to retry
# (x-should-retry: false): it raises at once with the wait in retry-after, instead of sleeping.
AGENTOPS_DROPIN_CLIENT_RETRY_MAX_MS = env_ms("AGENTOPS_DROPIN_CLIENT_RETRY_MAX_MS", 60_000)
# A streamed drop-in answer sends the client a keepalive whenever nothing else went to it for
# this long.
AGENTOPS_DROPIN_KEEPALIVE_MS = env_ms("AGENTOPS_DROPIN_KEEPALIVE_MS", 15_000)
# Idempotency-Key (architecture.md §14.2): a repeat within this long is answered from the
# record, no provider call; older keys are swept every AGENTOPS_IDEMPOTENCY_SWEEP_MS.
AGENTOPS_IDEMPOTENCY_TTL_S = env_ms("AGENTOPS_IDEMPOTENCY_TTL_MS", 86_400_000) / 1000
AGENTOPS_IDEMPOTENCY_SWEEP_S = env_ms("AGENTOPS_IDEMPOTENCY_SWEEP_MS", 3_600_000) / 1000
# A key in flight this long is taken as abandoned (its web process died mid-request): the next
# repeat takes it over and calls again, where it would otherwise be a 409 until the TTL. The
# default is the absolute call bound, past which no stream runs, plus a minute to record the
# answer; a live request whose key is taken over is paid twice, so with bounds off, a
# non-streamed call whose whole-call bound is longer, or a drop-in that waits for its quota and
# then retries a call cut before content (each attempt may run to the absolute bound), raise it.
AGENTOPS_IDEMPOTENCY_INFLIGHT_S = (
    env_ms("AGENTOPS_IDEMPOTENCY_INFLIGHT_MS", _ABSOLUTE_BOUND_MS + 60_000) / 1000
)
# The largest drop-in answer recorded to be replayed (body bytes, a stream's events included);
# a larger one is not: its repeat is a 409 saying so, never a second call.
AGENTOPS_IDEMPOTENCY_RECORD_BYTES = env_int(
    "AGENTOPS_IDEMPOTENCY_RECORD_BYTES", 1_048_576, minimum=0, maximum=64 * 1_048_576
)
# How many times a drop-in request calls again after a transient failure before the response
# started (a short stated wait, a 5xx, a network failure); 0: never.
AGENTOPS_DROPIN_RETRIES = env_int("AGENTOPS_DROPIN_RETRIES", 1, minimum=0, maximum=5)
# Provider calls go through the proxy HTTPS_PROXY / HTTP_PROXY name (NO_PROXY honoured).
AGENTOPS_PROVIDER_PROXY_FROM_ENV = env_bool("AGENTOPS_PROVIDER_PROXY_FROM_ENV", True)

# One worker at a time runs an agent's turns; it renews its lease every quarter of this.
AGENTOPS_TURN_LEASE_MS = env_ms("AGENTOPS_TURN_LEASE_MS", 60_000)
# A lapsed lease is taken over only once it has been lapsed this long, and not within this
# long of the database (re)starting: a live worker cut off by an outage renews its lease
# first (it retries every fraction of a second), so nobody calls again for its turns.
AGENTOPS_TURN_LEASE_GRACE_MS = env_ms("AGENTOPS_TURN_LEASE_GRACE_MS", 3_000)

# --- Celery -----------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A worker's task threads only hand turns over to the runtime's loop, where each
# agent's run is a coroutine (turns.drain): a few threads take turns from the broker
# as fast as it hands them out, and the webhooks' deliveries run beside them.
CELERY_WORKER_POOL = "threads"
CELERY_WORKER_CONCURRENCY = env_int("AGENTOPS_WORKER_CONCURRENCY", 8, minimum=1)
# How many agents' runs one worker process holds at once (each a coroutine, its call a socket);
# past it, the worker takes no more turns from the broker until one ends.
AGENTOPS_WORKER_TURNS = env_int("AGENTOPS_WORKER_TURNS", 10_000, minimum=1)
# A worker's bookkeeping threads (the turns' blocking ORM work, agentops.runtime), and how much
# lower their OS priority is than the loop's (their niceness raised by this; 0 leaves it): in a
# storm of cuts, with the cores full, the loop that times the cuts is scheduled first.
AGENTOPS_BOOKKEEPING_THREADS = env_int("AGENTOPS_BOOKKEEPING_THREADS", 4, minimum=1)
AGENTOPS_BOOKKEEPING_NICE = env_int("AGENTOPS_BOOKKEEPING_NICE", 10, maximum=19)
# A worker's collector walks what outlived a young collection only at a sweep (agentops.collector).
AGENTOPS_GC_SWEEP_MS = env_ms("AGENTOPS_GC_SWEEP_MS", 3_600_000)
CELERY_TASK_DEFAULT_QUEUE = env_str("AGENTOPS_CELERY_QUEUE", "agentops")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Redis redelivers a task that is not acknowledged within the visibility timeout. A drain task
# is acknowledged once it has handed its agent to the worker's loop; a task held for its
# countdown (a held turn's re-check) is not acknowledged until it runs, and countdowns are
# capped at half this timeout (agentops.celery.task_countdown_s).
_ABSOLUTE_CEILING_MS = ABSOLUTE_MS_DEFAULT
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": math.ceil((_ABSOLUTE_CEILING_MS + AGENTOPS_RETRY_EPISODE_MS) / 1000)
    + 600,
}
CELERY_BEAT_SCHEDULE = {
    "turns-sweep": {"task": "inference.tasks.turns_sweep", "schedule": AGENTOPS_TURN_SWEEP_S},
    "webhooks-sweep": {
        "task": "webhooks.tasks.webhooks_sweep",
        "schedule": AGENTOPS_WEBHOOK_SWEEP_S,
    },
    "idempotency-sweep": {
        "task": "interfaces.tasks.idempotency_sweep",
        "schedule": AGENTOPS_IDEMPOTENCY_SWEEP_S,
    },
}

# text: one line a record for people; json: one JSON object a line (time, level, logger,
# message, and any fields a record carries) for a log pipeline.
AGENTOPS_LOG_FORMAT = env_choice("AGENTOPS_LOG_FORMAT", "text", ("text", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Each line names its process and, while a span is current (a turn running, a request being
    # served), its trace and span ids (agentops.telemetry.LogContext): with web, workers and beat
    # on several hosts, a central log store tells them apart and ties a line to its trace.
    # Text: "... [w1@host pid 42]: message trace_id=... span_id=..."; JSON: host, worker,
    # trace_id, span_id fields.
    "filters": {"process": {"()": "agentops.telemetry.LogContext", "fields": AGENTOPS_LOG_FORMAT}},
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(where)s]: %(message)s%(trace)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d",
            "rename_fields": {
                "asctime": "time",
                "levelname": "level",
                "name": "logger",
                "process": "pid",
            },
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": AGENTOPS_LOG_FORMAT,
            "filters": ["process"],
        }
    },
    "root": {
        "handlers": ["console"],
        "level": env_choice(
            "AGENTOPS_LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")
        ).upper(),
    },
    "loggers": {
        "httpx": {"level": "WARNING"},
        "aiohttp": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        # Celery's "received" and "succeeded" lines for every task: an idle held turn's re-checks
        # made hundreds a minute. The service logs each decision that matters (held, released,
        # cut, failed, resumed) itself; task failures are still logged (at ERROR).
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
    },
}
