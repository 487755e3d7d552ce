"""Benchmark: one worker process holds N concurrent streamed calls that never send content.

The stand-in sends only a keepalive every ``--keepalive-ms`` on each stream. Every call must be
cut at its before-content deadline. Measured, in one run on this machine, against a bare
aiohttp reader of the same N streams measured in the same run (the baseline: the same client
library as the service, one task per stream reading its lines under one timeout), and beside it
the bare asyncio + httpx reader earlier results were measured against (``httpx_*``):
- cut lateness (cut time - deadline) p50 / p99 / max, over every cut (each turn's call and its
  one fresh call);
- worker CPU per 1,000 stream events in a steady window (no call starts or ends in it; at
  least two keepalive intervals long), and its ratio to the baseline's;
- RSS per held stream (the worker's RSS with every stream open, less its RSS before the first
  turn was handed to it, over N), beside the baseline's measured the same way;
- the time to open all N streams (from the first turn handed to the worker; the baseline from
  its start), its ratio to the baseline's, and the CPU each call start costs (CPU over that
  time, over N), beside the baseline's;
- the stand-in's CPU in the window (it must not be the limit), the worker's peak RSS and the
  peak number of database connections to the bench database.

Run: ``make bench`` (or ``python -m devtools.launcher exec -- python bench/bounds_bench.py``).
Options: ``--calls 1000 --keepalive-ms 1000 --repeat 3 --before-content-ms 60000`` (long enough
that every stream is open before the first cut), ``--first-cuts-only`` (each turn's first call
only: the worker is killed once they are all cut).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
# The measured window starts this long after every stream is open, and lasts at least this
# long and two keepalive intervals (so every stream sends a keepalive in it).
WINDOW_START_S, WINDOW_MIN_S = 1.0, 5.0


def window(keepalive_ms: int) -> tuple[float, float]:
    return WINDOW_START_S, WINDOW_START_S + max(WINDOW_MIN_S, 2 * keepalive_ms / 1000)


def per_1000_events_ms(cpu_s: float, n: int, keepalive_ms: int) -> float:
    start, end = window(keepalive_ms)
    events = n * (end - start) * 1000 / keepalive_ms
    return cpu_s * 1000 / events * 1000


# BENCH_DATABASE: another name when two checkouts bench on one server (each run empties it).
BENCH_DATABASE = os.environ.get("BENCH_DATABASE", "agentops_bench")


def bench_database_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path=f"/{BENCH_DATABASE}"))


OTLP_SINK = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def start_otlp_sink() -> subprocess.Popen[str]:
    """An OTLP/HTTP endpoint that takes and discards: the worker's export is measured, not a collector's."""
    proc = subprocess.Popen([sys.executable, "-c", OTLP_SINK], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{proc.stdout.readline().strip()}"
    return proc


def start_standin() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools.standin", "--port", "0"],
        cwd=BASE_DIR,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    return proc, line.removeprefix("standin listening on ")


# --- the baselines: bare readers of the same streams -----------------------------------------

BASELINE_AIOHTTP = r"""
import asyncio, json, sys, time, aiohttp
url, n, seconds, keepalive_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
body = {"model": f"pings:interval_ms={keepalive_ms}", "stream": True, "max_tokens": 256, "messages": [{"role": "user", "content": "x"}]}
opened = 0
async def one(session):
    global opened
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        opened += 1
        try:
            async with asyncio.timeout(seconds):
                async for _ in r.content:
                    pass
        except TimeoutError:
            return
async def main():
    print(json.dumps({"started": time.time()}), flush=True)
    await asyncio.sleep(1)  # the bench reads the RSS before any stream
    started = time.time()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(one(session)) for _ in range(n)]
        while opened < n:
            await asyncio.sleep(0.01)
        print(json.dumps({"all_open": time.time(), "started": started}), flush=True)
        await asyncio.gather(*tasks)
asyncio.run(main())
"""


BASELINE_HTTPX = r"""
import asyncio, json, sys, time, httpx, resource
url, n, seconds, keepalive_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
body = {"model": f"pings:interval_ms={keepalive_ms}", "stream": True, "max_tokens": 256, "messages": [{"role": "user", "content": "x"}]}
opened = 0
async def one(client):
    global opened
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        opened += 1
        deadline = time.monotonic() + seconds
        it = r.aiter_lines()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(it.__anext__(), left)
            except (asyncio.TimeoutError, StopAsyncIteration):
                return
async def main():
    print(json.dumps({"started": time.time()}), flush=True)
    await asyncio.sleep(1)  # the bench reads the RSS before any stream
    started = time.time()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        tasks = [asyncio.create_task(one(client)) for _ in range(n)]
        while opened < n:
            await asyncio.sleep(0.01)
        print(json.dumps({"all_open": time.time(), "started": started}), flush=True)
        await asyncio.gather(*tasks)
asyncio.run(main())
"""


def run_baseline(
    standin: str, n: int, seconds: float, keepalive_ms: int, script: str
) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, standin, str(n), str(seconds), str(keepalive_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    ps = psutil.Process(proc.pid)
    assert proc.stdout is not None
    json.loads(proc.stdout.readline())
    time.sleep(0.5)
    rss_before, cpu_before = ps.memory_info().rss, _cpu(ps)
    opened = json.loads(proc.stdout.readline())
    rss_open, cpu_open = ps.memory_info().rss, _cpu(ps)
    (cpu,) = _window_cpu(opened["all_open"], keepalive_ms, ps)
    proc.kill()  # measured: its streams need not run out
    proc.wait()
    return {
        "cpu_per_1000_events_ms": per_1000_events_ms(cpu, n, keepalive_ms),
        "rss_per_stream_kb": (rss_open - rss_before) / n / 1024,
        "open_all_s": opened["all_open"] - opened["started"],
        "cpu_per_call_start_ms": (cpu_open - cpu_before) / n * 1000,
    }


def _cpu(ps: psutil.Process) -> float:
    times = ps.cpu_times()
    return float(times.user + times.system)


def _window_cpu(start: float, keepalive_ms: int, *procs: psutil.Process) -> list[float]:
    """The CPU seconds each of ``procs`` used in the window after ``start``."""
    begin, end = window(keepalive_ms)
    time.sleep(max(start + begin - time.time(), 0))
    before = [_cpu(ps) for ps in procs]
    time.sleep(end - begin)
    return [_cpu(ps) - used for ps, used in zip(procs, before, strict=True)]


# --- the service: one worker process, threads pool, the engine loop --------------------------


def run_service(
    standin: str,
    n: int,
    before_content_ms: int,
    keepalive_ms: int,
    standin_pid: int,
    first_cuts_only: bool = False,
) -> dict[str, float]:
    import django

    os.environ["DATABASE_URL"] = bench_database_url()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
    queue = f"agentops-bench-{os.getpid()}"
    os.environ["AGENTOPS_CELERY_QUEUE"] = queue
    django.setup()
    from django.db import connection
    from django.db.models import Q

    from agentops.models import Agent, HistoryRow, Provider, default_project_id
    from inference.models import InferenceCall, Turn
    from interfaces.tasks import agent_drain

    InferenceCall.objects.all().delete()
    Turn.objects.all().delete()
    HistoryRow.objects.all().delete()
    Agent.objects.all().delete()
    Provider.objects.all().delete()
    provider = Provider.objects.create(name="standin", kind="openai", base_url=f"{standin}/v1")
    project_id = default_project_id()  # bulk_create skips the save() that sets it
    agents = Agent.objects.bulk_create(
        Agent(
            name=f"bench-{i}",
            project_id=project_id,
            provider=provider,
            model=f"pings:interval_ms={keepalive_ms}",
            participant=f"bench-{i}",
            max_tokens=256,
        )
        for i in range(n)
    )
    HistoryRow.objects.bulk_create(
        HistoryRow(agent=a, seq=1, participant="alice", role="user", content="hold on")
        for a in agents
    )
    Turn.objects.bulk_create(Turn(agent=a, status=Turn.Status.QUEUED) for a in agents)

    bounds = {"progress_bounds": {"before_content_ms": before_content_ms}}
    # The stand-in listens on loopback, which the provider policy refuses unless told.
    env = dict(
        os.environ,
        AGENTOPS_INFERENCE_BOUNDS=json.dumps(bounds),
        AGENTOPS_LOG_LEVEL="WARNING",
        AGENTOPS_PROVIDERS_ALLOW_PRIVATE="true",
    )
    worker = subprocess.Popen(
        # Started as the launcher starts it (its pool and capacity come from the settings).
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agentops",
            "worker",
            "-Q",
            queue,
            "-l",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"bench-{os.getpid()}@bench",
        ],
        cwd=BASE_DIR,
        env=env,
    )
    ps = psutil.Process(worker.pid)
    peak = {"rss": 0, "conns": 0}
    try:
        time.sleep(3)
        rss_before, cpu_before = ps.memory_info().rss, _cpu(ps)
        for agent in agents:
            agent_drain.delay(agent.pk)
        # The window starts once the worker holds every first call's stream open (a row is
        # written before its request is sent, so rows alone do not say the streams are open).
        enqueued = time.time()
        while _open_streams(standin) < n:
            if InferenceCall.objects.filter(outcome__isnull=False).exists():
                raise SystemExit(
                    "a call ended before every stream was open: raise --before-content-ms"
                )
            _sample(ps, peak, connection)
            time.sleep(0.05)
        all_open = time.time()
        rss_open, cpu_open = ps.memory_info().rss, _cpu(ps)
        profile = _profile_window(worker.pid, all_open, keepalive_ms)
        cpu, standin_cpu = _window_cpu(all_open, keepalive_ms, ps, psutil.Process(standin_pid))
        if profile is not None:
            profile.wait()
        begin, end = window(keepalive_ms)
        measured = (_dt(all_open + begin), _dt(all_open + end))
        # Steady means no call started or ended inside the window: only keepalives arrived.
        steady = not InferenceCall.objects.filter(
            Q(sent_at__range=measured) | Q(ended_at__range=measured)
        ).exists()
        _sample(ps, peak, connection)
        while (
            InferenceCall.objects.filter(outcome="cut").count() < n
            if first_cuts_only
            else Turn.objects.filter(status__in=Turn.OPEN).exists()
        ):
            _sample(ps, peak, connection)
            time.sleep(0.1)
    finally:
        if first_cuts_only:
            worker.kill()  # the fresh calls are not measured: a warm shutdown would wait for them
        else:
            worker.terminate()
        worker.wait(timeout=60)
    cuts = InferenceCall.objects.filter(outcome="cut").order_by("ended_at")
    lateness = [ms for ms in cuts.values_list("cut_lateness_ms", flat=True) if ms is not None][
        : n if first_cuts_only else None
    ]
    bounds_seen = set(InferenceCall.objects.values_list("bound", flat=True))
    lateness.sort()
    return {
        "open_all_s": all_open - enqueued,
        "cpu_per_call_start_ms": (cpu_open - cpu_before) / n * 1000,
        "rss_per_stream_kb": (rss_open - rss_before) / n / 1024,
        "window_steady": steady,
        "cuts": len(lateness),
        # (With --first-cuts-only, the fresh calls were still out when the worker was killed.)
        "all_cut_before_content": (
            bounds_seen <= {"before_content", None}
            if first_cuts_only
            else bounds_seen == {"before_content"}
        )
        and len(lateness) == (n if first_cuts_only else 2 * n),
        "lateness_p50_ms": statistics.median(lateness),
        "lateness_p99_ms": lateness[int(len(lateness) * 0.99) - 1],
        "lateness_max_ms": lateness[-1],
        "cpu_per_1000_events_ms": per_1000_events_ms(cpu, n, keepalive_ms),
        "standin_cores_in_window": standin_cpu / (end - begin),
        "worker_cores_in_window": cpu / (end - begin),
        "peak_rss_mb": peak["rss"] / 2**20,
        "peak_db_connections": peak["conns"],
    }


def _profile_window(pid: int, start: float, keepalive_ms: int) -> subprocess.Popen[bytes] | None:
    """With BENCH_PYSPY=<file>, record where the worker spends its CPU (GIL holders only) over
    the measured window, with py-spy (not a project dependency: pip install py-spy)."""
    out = os.environ.get("BENCH_PYSPY")
    if not out:
        return None
    begin, end = window(keepalive_ms)
    time.sleep(max(start + begin - time.time(), 0))
    return subprocess.Popen(
        [
            "py-spy",
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(end - begin)),
            "--gil",
            "--nonblocking",
            "--format",
            "raw",
            "-o",
            out,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _open_streams(standin: str) -> int:
    """Established connections to the stand-in's port (from the client side), read with ss:
    psutil cannot map this sandbox's sockets to processes. Only one client runs at a time."""
    port = urlsplit(standin).port
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", "dst", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return len(out.stdout.splitlines())


def _dt(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _sample(ps: psutil.Process, peak: dict[str, int], connection: object) -> None:
    peak["rss"] = max(peak["rss"], ps.memory_info().rss)
    with connection.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        peak["conns"] = max(peak["conns"], cursor.fetchone()[0])


def prepare_database() -> None:
    import psycopg

    admin = urlsplit(os.environ["DATABASE_URL"])._replace(path="/postgres")
    with psycopg.connect(urlunsplit(admin), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DATABASE]
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=BASE_DIR,
        check=True,
        env=dict(os.environ, DATABASE_URL=bench_database_url()),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--keepalive-ms", type=int, default=1000)
    # Measure the first call of each turn only (its cut), not the fresh call after it: a run
    # at 10,000 streams then takes one before-content bound, not two.
    parser.add_argument("--first-cuts-only", action="store_true")
    # The worker exports OpenTelemetry traces and metrics (the default batch processor) to an
    # OTLP/HTTP sink on loopback, a process of its own that discards what it gets.
    parser.add_argument("--otel", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    # Long enough that every call is open before the first one is cut (the CPU window).
    parser.add_argument("--before-content-ms", type=int, default=60000)
    # The service alone: for paired runs of two trees, where the readers would only take time.
    parser.add_argument("--no-baselines", action="store_true")
    args = parser.parse_args()
    prepare_database()
    sink = start_otlp_sink() if args.otel else None
    standin, url = start_standin()
    results: list[dict[str, float]] = []
    try:
        for run in range(args.repeat):
            service = _in_child(
                url,
                args.calls,
                args.before_content_ms,
                args.keepalive_ms,
                standin.pid,
                args.first_cuts_only,
            )
            if not args.no_baselines:
                _beside_baselines(service, url, args)
            print(f"run {run + 1}: {json.dumps(service)}", flush=True)
            results.append(service)
    finally:
        standin.terminate()
        if sink is not None:
            sink.terminate()
    keys = [
        k
        for k in results[0]
        if isinstance(results[0][k], int | float) and not isinstance(results[0][k], bool)
    ]
    flags = {k for k in results[0] if isinstance(results[0][k], bool)}
    print(
        json.dumps(
            {
                "calls": args.calls,
                "keepalive_ms": args.keepalive_ms,
                "otel": args.otel,
                "runs": args.repeat,
                "median": {k: statistics.median(r[k] for r in results) for k in keys},
                **{k: all(r[k] for r in results) for k in flags},
            },
            indent=2,
        )
    )


def _beside_baselines(service: dict[str, float], url: str, args: argparse.Namespace) -> None:
    """The two bare readers of the same streams, run after the service, and the ratios to them."""
    base = run_baseline(
        url, args.calls, args.before_content_ms / 1000, args.keepalive_ms, BASELINE_AIOHTTP
    )
    plain = run_baseline(
        url, args.calls, args.before_content_ms / 1000, args.keepalive_ms, BASELINE_HTTPX
    )
    for key, value in base.items():
        service[f"baseline_{key}"] = value
    for key, value in plain.items():
        service[f"httpx_{key}"] = value
    service["cpu_ratio"] = service["cpu_per_1000_events_ms"] / base["cpu_per_1000_events_ms"]
    service["open_all_ratio"] = service["open_all_s"] / base["open_all_s"]


def _in_child(
    url: str,
    n: int,
    before_content_ms: int,
    keepalive_ms: int,
    standin_pid: int,
    first_cuts_only: bool,
) -> dict[str, float]:
    """Each service run in a fresh interpreter, so Django state never carries over."""
    code = f"import json, bench.bounds_bench as b; print('RESULT ' + json.dumps(b.run_service({url!r}, {n}, {before_content_ms}, {keepalive_ms}, {standin_pid}, {first_cuts_only})))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, stdout=subprocess.PIPE, text=True
    )
    if done.returncode:
        raise SystemExit(f"the service run failed (exit {done.returncode}); its error is above")
    out = done.stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


if __name__ == "__main__":
    main()
