"""Benchmark: how long the spend read-backs take over a million call rows (issue 55).

Measured, through one uvicorn process on loopback (the production settings, a real PostgreSQL),
each request's latency as the client sees it, p50 and p95 per endpoint:

- ``GET /api/v1/spend?group_by=agent|project|model|day`` with an operator token and no
  ``since``/``until`` (every row: the widest read);
- the admin's spend page of one project, ``/admin/agentops/project/<id>/spend/``, with its
  default days and with ``?days=30`` (the project with the most calls);
- the admin's spend of all projects, ``/admin/agentops/project/spend/``, the same two ways;

both admin pages with a logged-in staff session. The endpoints are asked in turn, request by
request, so the machine's noise falls on all alike; each run's quantiles are printed, and the
table's are the medians of the runs'.

The rows (``--rows``, default 1,000,000) are made by one ``INSERT ... SELECT FROM
generate_series`` in a database of the bench's own (``BENCH_DATABASE``, default
``agentops_spend_bench``), created and migrated first and dropped at the end unless ``--keep``;
``--reuse`` takes a kept database as it is (its rows not made again, new migrations applied).
Their spread: ~30 days ending now (ids rising with time, as a live service writes them),
``--projects`` 20 projects and ``--agents`` 100 agents (some busier than others), three
providers with three models each; 90% completed, priced and with usage, 5% completed and
unpriced, 4% errors before any answer (cost 0), 1% cut without usage reported (no cost), and a
few still in flight. Then ANALYZE. Run it under the launcher (the embedded PostgreSQL, or the
servers ``DATABASE_URL`` and ``REDIS_URL`` name)::

    python -m devtools.launcher exec -- .venv/bin/python bench/spend_bench.py
    make bench-spend ARGS="--requests 20 --explain"     # the same

Results, and what the plans say: docs/performance.md.

Options: ``--requests 40`` per endpoint and run, ``--repeat 3``, ``--explain`` (print each
endpoint's statements' plans, EXPLAIN ANALYZE, once before timing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.web import bench_database_url, free_port, quantiles, uvicorn, wait_up  # noqa: E402

DATABASE = os.environ.get("BENCH_DATABASE", "agentops_spend_bench")
TARGET_P95_MS = 200.0
GROUP_BYS = ("agent", "project", "model", "day")


def _admin_url() -> str:
    return urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path="/postgres"))


def database_exists() -> bool:
    import psycopg

    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        return found.fetchone() is not None


def create_database() -> None:
    import psycopg

    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')


def drop_database() -> None:
    import psycopg

    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def migrate(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=BASE_DIR, check=True, env=env
    )


# Projects, providers, agents and a few budgets through the ORM (a handful of rows); then the
# calls in one statement. argv: projects agents rows.
SEED = r"""
import django, sys
django.setup()
from datetime import timedelta
from decimal import Decimal
from django.conf import settings
from django.db import connection
from django.utils import timezone
from agentops.budget_core import period_bounds
from agentops.models import Agent, Budget, Project, Provider

projects_n, agents_n, rows = (int(a) for a in sys.argv[1:4])
kinds = ("openai", "anthropic", "openai-responses")
providers = [
    Provider.objects.create(name=f"bench-{kind}", kind=kind, base_url=f"http://127.0.0.1:9/{kind}")
    for kind in kinds
]
projects = [Project.objects.create(name=f"bench-project-{p:02d}") for p in range(projects_n)]
agents = [
    Agent.objects.create(
        name=f"bench-agent-{a:03d}",
        project=projects[a % projects_n],
        provider=providers[a % len(providers)],
        model="m",
        participant="bench",
    )
    for a in range(agents_n)
]
now = timezone.now()
zone = settings.AGENTOPS_BUDGET_TIME_ZONE
for i, owner in enumerate(projects[:5] + agents[:10]):
    period = ("day", "week", "month")[i % 3]
    kw = {"project": owner} if isinstance(owner, Project) else {"agent": owner}
    Budget.objects.create(
        amount=Decimal(1000), period=period, period_start=period_bounds(period, now, zone)[0],
        spent=Decimal(120 * (i + 1)), **kw,
    )
with connection.cursor() as cur:
    cur.execute(
        '''
        INSERT INTO inference_inferencecall (
            agent_id, provider_id, kind, model, route, route_kind, streamed, round,
            model_events, keepalives, stop_reason, probe_verdict, marks, cost_basis,
            sent_at, ended_at, outcome, error, input_tokens, output_tokens, cost, created_at)
        SELECT a.ids[s.ai], a.provs[s.ai], 'primary',
            (ARRAY['gpt-4o', 'gpt-4o-mini', 'o3-mini', 'claude-sonnet-4', 'claude-haiku-4',
                   'claude-opus-4', 'gpt-5', 'gpt-5-mini', 'gpt-5-nano'])
                [((s.ai - 1) %% 3) * 3 + 1 + floor(s.v * 3)::int],
            'primary', 'primary', s.v < 0.7, 0, 0, 0, '', '', '{}',
            CASE WHEN s.u < 0.90 THEN 'priced' WHEN s.u < 0.95 THEN 'unpriced'
                 WHEN s.u < 0.99 THEN 'nothing used' ELSE 'usage unreported' END,
            s.t - interval '2 seconds', CASE WHEN s.live THEN NULL ELSE s.t END,
            CASE WHEN s.live THEN NULL WHEN s.u < 0.95 THEN 'completed'
                 WHEN s.u < 0.99 THEN 'error' ELSE 'cut' END,
            CASE WHEN s.u >= 0.95 AND s.u < 0.99 THEN '{"type": "server"}'::jsonb END,
            CASE WHEN s.u < 0.95 THEN 200 + floor(s.w * 4000)::int END,
            CASE WHEN s.u < 0.95 THEN 20 + floor(s.v * 800)::int END,
            CASE WHEN s.live THEN NULL
                 WHEN s.u < 0.90 THEN ((200 + floor(s.w * 4000)) * 3
                                       + (20 + floor(s.v * 800)) * 15)::numeric / 1000000
                 WHEN s.u < 0.95 THEN NULL WHEN s.u < 0.99 THEN 0 END,
            s.t - interval '2 seconds'
        FROM (
            SELECT g,
                -- Some agents far busier than others: the low numbers take most calls.
                1 + floor(power(random(), 2) * %(agents)s)::int AS ai,
                random() AS u, random() AS v, random() AS w,
                g > %(rows)s - 50 AS live,
                now() - interval '30 days' * (1 - g::float / %(rows)s)
                    - random() * interval '20 seconds' AS t
            FROM generate_series(1, %(rows)s) g
        ) s CROSS JOIN (
            SELECT array_agg(id ORDER BY name) AS ids, array_agg(provider_id ORDER BY name) AS provs
            FROM agentops_agent WHERE name LIKE 'bench-agent-%%'
        ) a
        ''',
        {"agents": agents_n, "rows": rows},
    )
    cur.execute("ANALYZE")
"""

# An operator token and a logged-in staff user's session cookie, for the server to check.
CREDENTIALS = r"""
import django
django.setup()
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Count
from django.test import Client
from agentops.tokens import api_token_create
from inference.models import InferenceCall
User = get_user_model()
user = User.objects.filter(username="bench-admin").first() or User.objects.create_superuser(
    "bench-admin", "bench@example.invalid", "unused-password-0"
)
client = Client()
client.force_login(user)
busiest = (
    InferenceCall.objects.values("agent__project_id").annotate(n=Count("id")).order_by("-n")
    .values_list("agent__project_id", flat=True).first()
)
print(api_token_create(name="bench-spend", operator=True)[1])
print(settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)
print(busiest)
"""

# The statements each endpoint's reads run, caught as they run and EXPLAIN ANALYZE'd
# (``--explain``). argv: the project's id.
EXPLAIN = r"""
import django, sys
django.setup()
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from interfaces.spend import all_projects_spend, project_spend, spend_calls, spend_items

now = timezone.now()
reads = {
    f"GET /spend?group_by={g}": (
        lambda g=g: spend_items(spend_calls(project_id=None, since=None, until=None), group_by=g)
    )
    for g in ("agent", "project", "model", "day")
}
reads["a project's spend, 30 days"] = lambda: project_spend(
    project_id=int(sys.argv[1]), days=30, now=now
)
reads["all projects' spend, 30 days"] = lambda: all_projects_spend(days=30, now=now)
for what, read in reads.items():
    with CaptureQueriesContext(connection) as caught:
        read()
    for query in caught.captured_queries:
        if "inference_inferencecall" not in query["sql"]:
            continue
        print(f"--- {what}: {query['sql']}")
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + query["sql"])
            print("\n".join(row[0] for row in cur.fetchall()))
"""


def python(code: str, *args: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=BASE_DIR,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()


def timed(
    client: httpx.Client, targets: dict[str, tuple[str, dict[str, str]]], n: int
) -> dict[str, list[float]]:
    """Each target asked ``n`` times, in turn request by request (rotating which goes first)."""
    times: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    for i in range(n):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            url, headers = targets[name]
            start = time.perf_counter()
            response = client.get(url, headers=headers)
            elapsed = (time.perf_counter() - start) * 1000
            assert response.status_code == 200, (name, response.status_code, response.text[:300])
            times[name].append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--projects", type=int, default=20)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the database for --reuse")
    parser.add_argument("--reuse", action="store_true", help="take the kept database as it is")
    parser.add_argument("--explain", action="store_true", help="print the queries' plans first")
    args = parser.parse_args()

    env = dict(
        os.environ,
        DATABASE_URL=bench_database_url(DATABASE),
        DJANGO_SETTINGS_MODULE="agentops.settings",
        AGENTOPS_LOG_LEVEL="WARNING",
    )
    reuse = args.reuse and database_exists()
    started = time.monotonic()
    if not reuse:
        create_database()
    migrate(env)
    if not reuse:
        python(SEED, str(args.projects), str(args.agents), str(args.rows), env=env)
        print(f"{args.rows:,} call rows made and analysed in {time.monotonic() - started:.0f} s")
    token, cookie, project = python(CREDENTIALS, env=env)[-3:]
    cookie_name, cookie_value = cookie.split(" ", 1)
    if args.explain:
        print("\n".join(python(EXPLAIN, project, env=env)))

    port = free_port()
    server = uvicorn(port, env)
    runs: list[dict[str, dict[str, float]]] = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_up(f"{base}/health", server, "uvicorn")
        api = {"authorization": f"Bearer {token}"}
        session = {"cookie": f"{cookie_name}={cookie_value}"}
        targets: dict[str, tuple[str, dict[str, str]]] = {
            f"GET /spend?group_by={g}": (f"{base}/api/v1/spend?group_by={g}", api)
            for g in GROUP_BYS
        }
        page = f"{base}/admin/agentops/project/{project}/spend/"
        every = f"{base}/admin/agentops/project/spend/"
        targets["admin: a project's spend (default days)"] = (page, session)
        targets["admin: a project's spend, days=30"] = (f"{page}?days=30", session)
        targets["admin: all projects' spend (default days)"] = (every, session)
        targets["admin: all projects' spend, days=30"] = (f"{every}?days=30", session)
        with httpx.Client(timeout=120) as client:
            for url, headers in targets.values():  # warm-up, and the pages answer as staff
                response = client.get(url, headers=headers)
                assert response.status_code == 200, (url, response.status_code)
                assert b"login" not in response.url.path.encode(), url
            for run in range(args.repeat):
                result = {k: quantiles(v) for k, v in timed(client, targets, args.requests).items()}
                runs.append(result)
                print(
                    f"run {run + 1}: "
                    + ", ".join(f"{k} {q['p50']:.0f}/{q['p95']:.0f}" for k, q in result.items()),
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(timeout=30)
        if not args.keep:
            drop_database()

    print(
        f"\n{args.rows:,} call rows, {args.requests} requests per endpoint and run, "
        f"medians of {args.repeat} runs (ms)"
    )
    width = max(len(k) for k in runs[0])
    print(f"{'endpoint':<{width}}  {'p50':>7}  {'p95':>7}  target p95 <= {TARGET_P95_MS:.0f} ms")
    for name in runs[0]:
        p50 = statistics.median(r[name]["p50"] for r in runs)
        p95 = statistics.median(r[name]["p95"] for r in runs)
        verdict = "met" if p95 <= TARGET_P95_MS else "NOT MET"
        print(f"{name:<{width}}  {p50:7.1f}  {p95:7.1f}  {verdict}")


if __name__ == "__main__":
    main()
