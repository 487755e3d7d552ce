"""Benchmark: turn throughput end to end, against Celery tasks making the same call (issue 15).

The targets, for short turns on 200 agents, submit to ``succeeded`` end to end, each rate
measured in the same run as its baseline's (targets, not results: a run's ratios say where
it stands):
- non-streamed turns: at least the rate (1.0x) of the ORM view and task, what a user would
  write instead: a plain Django view that takes the turn over HTTP (``bench/turns_bench_web.py``)
  and a Celery task that makes the same direct call to the stand-in and writes the same rows
  with the Django ORM (``bench/turns_bench_orm.py``: the turn's status, the call row, the
  answer in the history, a lease);
- streamed turns: at least half the rate (0.5x) of the bare task (``bench/turns_bench_bare.py``),
  a Celery task that makes the same call and writes nothing;
- a lone turn: its submit-to-succeeded beyond its call's own duration at most 20 ms p50.

One run of this script starts, on a bench database (``BENCH_DATABASE``, default
``agentops_turns_bench``, dropped, created and migrated each time) and a Redis given by
``BENCH_REDIS_URL`` (default ``REDIS_URL``): its own stand-in provider, the web app (uvicorn on
the ASGI app), ONE service worker and beat, started as ``devtools.launcher`` starts them
(the worker without ``-P`` or ``-c``: its pool and concurrency are the settings'
``CELERY_WORKER_POOL`` and ``CELERY_WORKER_CONCURRENCY``, e.g. ``AGENTOPS_WORKER_CONCURRENCY``;
``make run``'s launcher passes ``-c 2``), the bare worker (``bench/turns_bench_bare.py``: the
service's Celery settings, hence the same pool and concurrency, on a queue of its own) and
the ORM worker (``bench/turns_bench_orm.py``: the same, with Django on the bench database);
the bench checks the three workers' banners agree. After the warm-up it starts the ORM view's
web app (``bench/turns_bench_web.py``) with the web app's uvicorn options. The provider policy
allows loopback for the stand-in. Every process stops when the bench ends, fails or is killed.

Each repeat measures, for streamed and non-streamed agents (the agent's ``stream``), with the
stand-in's ``answer`` scenario (three short text deltas):
- direct: N concurrent httpx calls from this process straight to the stand-in, calls/s (what
  the stand-in serves with a client that is not the service);
- bare: N bare Celery tasks sent at once, each making the same call (the body and headers the
  service's worker sent, as the stand-in recorded them at warm-up) and pushing its end time
  onto a Redis list; tasks/s = N / (last ended - first sent);
- ORM: N ORM tasks sent at once, each running the queued turn of one of N agents of its own
  and making the bare tasks' call: it takes the agent's lease, marks the turn running,
  creates the call row, calls, completes the call row, appends the answer to the history,
  marks the turn succeeded and deletes the lease, all with the ORM, then pushes its end time
  as the bare task does; tasks/s = N / (last ended - first sent). The turns (the user's
  message, the turn, their link) are written by this process with the ORM just before,
  outside the timed span, with beat stopped (SIGSTOP) until they have ended, lest its sweep
  hand them to the service's worker. The ORM worker's CPU a task, and the bench database's
  PostgreSQL backends';
- ORM view: one short turn submitted to each of N agents at once, as in the turns burst but
  to the ORM view's web app, which writes the turn and sends the ORM task on commit (beat
  stopped as for the ORM tasks); turns/s = N / (last turn's ``ended_at`` - first submit), the
  baseline of the API burst's non-streamed target, and per turn the view's, the ORM worker's
  and PostgreSQL's CPU;
- turns: one short turn submitted to each of N agents, concurrently, through
  ``POST /api/v1/agents/{name}/turns``; turns/s = N / (last turn's ``ended_at`` - first submit,
  taken just before its POST; a 503, the web app's answer when its database pool is busy, is
  sent again after 0.2 s and counted, the turn keeping its first submit time); per turn, from the Turn and InferenceCall rows: submit to
  succeeded p50/p99, submit to created, created to sent, the call's sent to ended, call end
  to turn end; the CPU time the stand-in, the worker, the web app, beat, the bench database's
  PostgreSQL backends and this process used during the burst (psutil), and the rest of the
  machine's (other people's work on a shared machine shows there);
- worker burst: one turn to each of N other agents queued in one commit by ``turn_submit``
  (the function the API calls; the drains are sent on commit), so the worker's own rate shows
  with the web app out of the way: turns/s = N / (last ``ended_at`` - the commit);
- intake alone: one turn to each of N other agents through the API, as in the turns burst,
  with the service's worker stopped (SIGSTOP, resumed after; the turns then run unmeasured):
  turns accepted/s = N / (last 202 - first submit), and the web app's, the bench database's
  and this process's CPU a turn. The web app alone is a ceiling on the API burst's rate,
  whatever the worker costs;
- refused: the intake's POSTs again with a token that does not exist, each answered 401 after
  the token's lookup, no view run: the web app's CPU a request, a floor under its CPU a turn;
- lone: ``--lone`` turns on one agent, each submitted once the one before has succeeded:
  (submit to the turn's ``ended_at``) - (its call's ``sent_at`` to ``ended_at``), p50/p99.
  "Submit" is this process's clock just before the POST and "succeeded" the turn's
  ``ended_at`` as the worker wrote it (same machine, same clock); client-observed times (a
  poll every 10 ms) are reported beside them.
It then prints each run's values, the medians of the runs and the ratios turns/s : bare
tasks/s and turns/s : ORM tasks/s (API burst, the issue's numbers, and worker burst:
``ratio_turns_to_bare``, ``ratio_worker_turns_to_bare``, ``turns_to_orm``, ``worker_to_orm``)
and API burst turns/s : ORM view turns/s (``turns_to_web_orm``, both paying an intake),
the machine's CPU a turn may use at the target (its cores' time over the mode's target rate)
against what a turn of the API burst used (every process, and the rest of the machine: Redis
is there), says whether the stand-in was the
limit (it is one process on one event loop: near a full core busy, or turns near its direct
rate), and writes everything to ``bench/results/turns-<UTC time>.json`` (not committed).

Run: ``make bench-turns`` (or ``python -m devtools.launcher exec -- python bench/turns_bench.py``).
Options: ``--agents 200 --lone 30 --repeat 3 --timeout 300`` (seconds any one wait may take).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
RESULTS_DIR = BASE_DIR / "bench" / "results"
PY = sys.executable

# BENCH_DATABASE: another name when two checkouts bench on one server (each run drops it).
BENCH_DATABASE = os.environ.get("BENCH_DATABASE", "agentops_turns_bench")
MESSAGE = {"participant": "alice", "content": "Hi"}
MODEL = "answer"  # the stand-in's short answer: three text deltas 10 ms apart when streamed
MAX_TOKENS = 64
MODES = {"streamed": True, "non_streamed": False}
LONE_POLL_S = 0.01
BURST_POLL_S = 0.25  # one count query per poll: the bench must not load the service it measures
STANDIN_LIMIT_UTIL = 0.8  # of one core: the stand-in is one process with one event loop
# The targets (the module's docstring): per mode, the baseline's rate the API burst's turns/s
# is held to, and the share of it; a lone turn's time beyond its call, p50.
TARGETS = {"streamed": ("bare", 0.5), "non_streamed": ("web_orm", 1.0)}
BASELINE_NAMES = {"bare": "bare tasks", "orm": "ORM tasks", "web_orm": "ORM view and task"}
LONE_TARGET_MS = 20
TAG = f"tbench-{os.getpid()}"
T = TypeVar("T")
DOING = ["starting"]  # what the bench is doing, for the message when it stops short


class Queues(NamedTuple):
    """The Celery queues of this run: the service's worker's, the bare worker's, the ORM worker's."""

    service: str
    bare: str
    orm: str


class BenchError(Exception):
    """What was not reached, and where to look."""


def bench_database_url() -> str:
    return urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path=f"/{BENCH_DATABASE}"))


def bench_redis_url() -> str:
    return os.environ.get("BENCH_REDIS_URL") or os.environ["REDIS_URL"]


def prepare_database() -> None:
    import psycopg

    admin = urlsplit(os.environ["DATABASE_URL"])._replace(path="/postgres")
    with psycopg.connect(urlunsplit(admin), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')
    subprocess.run(
        [PY, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=BASE_DIR,
        check=True,
        env=dict(os.environ, DATABASE_URL=bench_database_url()),
        timeout=300,
    )


# --- the processes: started here, stopped on the way out whatever happens ----------------------


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when this bench dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Children:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[str], Path]] = []

    def start(
        self, name: str, command: list[str], env: dict[str, str], *, stdout_pipe: bool = False
    ) -> subprocess.Popen[str]:
        log_path = self.logs / f"{name}.log"
        log = log_path.open("w")
        proc = subprocess.Popen(
            command,
            cwd=BASE_DIR,
            env=env,
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else log,
            stderr=log if stdout_pipe else subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        log.close()
        self.procs.append((name, proc, log_path))
        return proc

    def check(self) -> None:
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                raise BenchError(
                    f"the {name} process exited (status {proc.returncode}); the end of {log}:\n{_tail(log)}"
                )

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 30  # a worker's warm shutdown lets its running tasks end
        for name, proc, _ in reversed(self.procs):
            try:
                proc.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                print(
                    f"the {name} process did not stop within 30 s of SIGTERM: killed",
                    file=sys.stderr,
                )
                proc.kill()
                proc.wait()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _read_line(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise BenchError(f"{what} printed nothing within {timeout:g} s")
    return proc.stdout.readline().strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(
    what: str, ready: Callable[[], bool], timeout: float, children: Children, every: float = 0.2
) -> None:
    end = time.monotonic() + timeout
    while not ready():
        children.check()
        if time.monotonic() > end:
            raise BenchError(f"{what}: not reached within {timeout:g} s")
        time.sleep(every)


def uvicorn_command(app: str, port: int) -> list[str]:
    """The web app's command (devtools/launcher.py, run); the ORM view's web app runs with the
    same options."""
    return [
        PY,
        "-m",
        "uvicorn",
        app,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


class Service:
    """The stand-in, the web app, the service's worker and beat, the bare worker and the ORM
    worker; after the warm-up, the ORM view's web app (``start_web_orm``)."""

    def __init__(
        self,
        children: Children,
        service_queue: str,
        bare_conf: dict[str, Any],
        orm_conf: dict[str, Any],
    ) -> None:
        self.children = children
        self.orm_conf = orm_conf
        env = dict(
            os.environ,
            DATABASE_URL=bench_database_url(),
            REDIS_URL=bench_redis_url(),
            DJANGO_SETTINGS_MODULE="agentops.settings",
            PYTHONUNBUFFERED="1",
            AGENTOPS_CELERY_QUEUE=service_queue,
            # The stand-in listens on loopback, which the provider policy refuses unless told.
            AGENTOPS_PROVIDERS_ALLOW_PRIVATE="true",
        )
        env.pop("AGENTOPS_PROCESS_ROLE", None)  # interfaces.asgi sets "web" for the web app alone
        # The launcher's commands (devtools/launcher.py, run), less the worker's "-c": the
        # worker's pool and concurrency are the settings' (CELERY_WORKER_POOL, _CONCURRENCY).
        standin = children.start(
            "standin",
            [PY, "-m", "devtools.standin", "--host", "127.0.0.1", "--port", "0"],
            env,
            stdout_pipe=True,
        )
        line = _read_line(standin, 30, "the stand-in")
        if not line.startswith("standin listening on "):
            raise BenchError(f"the stand-in did not start (it printed {line!r})")
        self.standin_url = line.removeprefix("standin listening on ")
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.web = children.start("web", uvicorn_command("interfaces.asgi:application", port), env)
        self.worker_name = f"{TAG}@bench"
        self.worker = children.start(
            "worker",
            [PY, "-m", "celery", "-A", "agentops", "worker", "-l", "info", "-n", self.worker_name],
            env,
        )
        self.beat = children.start(
            "beat",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "agentops",
                "beat",
                "-l",
                "info",
                "-s",
                str(children.logs / "celerybeat-schedule"),
            ],
            env,
        )
        bare_env = {
            k: v for k, v in env.items() if k != "DJANGO_SETTINGS_MODULE"
        }  # no Django in the bare worker
        bare_env["TBENCH_CELERY_CONF"] = json.dumps(bare_conf)
        self.bare_name = f"{TAG}-bare@bench"
        self.bare = children.start(
            "bare-worker",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "bench.turns_bench_bare",
                "worker",
                "-l",
                "info",
                "-n",
                self.bare_name,
            ],
            bare_env,
        )
        # The ORM worker: the same Celery settings, its own queue, Django on the bench database.
        orm_env = dict(env, TBENCH_CELERY_CONF=json.dumps(orm_conf))
        self.orm_name = f"{TAG}-orm@bench"
        self.orm = children.start(
            "orm-worker",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "bench.turns_bench_orm",
                "worker",
                "-l",
                "info",
                "-n",
                self.orm_name,
            ],
            orm_env,
        )
        self.standin = standin
        self.env = env
        wait_until(
            "the web app answering /health", lambda: _http_ok(f"{self.base}/health"), 60, children
        )
        from bench import turns_bench_bare as bare

        for name in (self.worker_name, self.bare_name, self.orm_name):
            wait_until(
                f"the worker {name} answering a ping", partial(_pings, bare.app, name), 90, children
            )
        self.pools = {
            name: _banner(children.logs / f"{name.replace('_', '-')}.log")
            for name in ("worker", "bare_worker", "orm_worker")
        }
        for name in ("bare_worker", "orm_worker"):
            if self.pools[name] != self.pools["worker"]:
                raise BenchError(
                    f"the {name.replace('_', ' ')} does not run as the service's worker does: {self.pools}"
                )
        self.processes = {
            "standin": standin.pid,
            "worker": self.worker.pid,
            "web": self.web.pid,
            "beat": self.beat.pid,
            "bare_worker": self.bare.pid,
            "orm_worker": self.orm.pid,
        }

    def start_web_orm(self, wires: dict[str, dict[str, Any]], results_key: str) -> None:
        """The ORM view's web app, on the bench database, sending the ORM task to the ORM
        worker's queue with the wire requests the warm-up recorded."""
        port = free_port()
        self.web_orm_base = f"http://127.0.0.1:{port}"
        self.web_orm_key = results_key
        env = dict(
            self.env,
            TBENCH_CELERY_CONF=json.dumps(self.orm_conf),
            TBENCH_WIRES=json.dumps(wires),
            TBENCH_RESULTS_KEY=results_key,
        )
        self.web_orm = self.children.start(
            "web-orm", uvicorn_command("bench.turns_bench_web:application", port), env
        )
        # The view answers only POST: a 405 to a GET says it is up.
        wait_until(
            "the ORM view's web app answering",
            lambda: _http_status(f"{self.web_orm_base}/api/v1/agents/x/turns") == 405,
            60,
            self.children,
        )
        self.processes["web_orm"] = self.web_orm.pid


def _pings(app: Any, name: str) -> bool:
    return bool(app.control.ping(destination=[name], timeout=0.5))


def _http_ok(url: str) -> bool:
    return _http_status(url) == 200


def _http_status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def _banner(log: Path) -> str:
    """The worker's "concurrency: 200 (thread)" line, as it printed it at startup."""
    for line in log.read_text(errors="replace").splitlines():
        if "concurrency:" in line:
            return line.split("concurrency:", 1)[1].strip()
    raise BenchError(f"no concurrency line in the worker's banner ({log})")


# --- CPU accounting ----------------------------------------------------------------------------


class Cpu:
    """CPU seconds of our processes and of the whole machine between start() and stop()."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.procs["bench"] = psutil.Process()

    def _now(self) -> tuple[dict[str, float], float]:
        own = {}
        for name, proc in self.procs.items():
            times = proc.cpu_times()
            own[name] = times.user + times.system
        own["postgres"] = sum(self._backends().values())
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        return own, busy

    def _backends(self) -> dict[int, float]:
        """CPU seconds of the PostgreSQL backends on the bench database, by pid, since each
        started: those alive now (a backend that ended meanwhile is not counted)."""
        found = {}
        for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if cmdline.startswith("postgres:") and f" {BENCH_DATABASE} " in cmdline:
                times = proc.info["cpu_times"]
                found[proc.pid] = times.user + times.system if times else 0.0
        self._seen = getattr(self, "_seen", {}) | found
        return found

    def start(self) -> None:
        self._start = self._now()
        self._at_start = dict(self._seen)

    def stop(self, wall_s: float, names: Sequence[str]) -> dict[str, float]:
        own, busy = self._now()
        used = {name: own[name] - self._start[0][name] for name in own}
        # Backends that started meanwhile count from zero, those gone meanwhile not at all.
        now = self._backends()
        used["postgres"] = sum(cpu - self._at_start.get(pid, 0.0) for pid, cpu in now.items())
        out = {f"cpu_{name}_s": used[name] for name in names}
        out["cpu_others_s"] = max(busy - self._start[1] - sum(used.values()), 0.0)
        out["cpu_standin_util"] = used["standin"] / wall_s
        return out


# --- the three measurements ----------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _ms(seconds: Sequence[float]) -> dict[str, float]:
    return {"p50": statistics.median(seconds) * 1000, "p99": quantile(seconds, 0.99) * 1000}


def direct(pids: dict[str, int], wire: dict[str, Any], n: int, timeout: float) -> dict[str, float]:
    """N concurrent calls from this process straight to the stand-in, on a fresh client."""

    async def main() -> tuple[float, list[tuple[float, float]]]:
        async with _clients(timeout) as clients:

            async def one(i: int) -> tuple[float, float]:
                client = clients[i % len(clients)]
                start = time.time()
                if wire["body"]["stream"]:
                    async with client.stream(
                        "POST", wire["url"], headers=wire["headers"], json=wire["body"]
                    ) as response:
                        async for _ in response.aiter_lines():
                            pass
                else:
                    response = await client.post(
                        wire["url"], headers=wire["headers"], json=wire["body"]
                    )
                    response.json()
                if response.status_code != 200:
                    raise BenchError(
                        f"a direct call to the stand-in answered {response.status_code}"
                    )
                return start, time.time()

            first = time.time()
            return first, await asyncio.gather(*(one(i) for i in range(n)))

    cpu = Cpu(pids)
    cpu.start()
    first, spans = _phase("direct calls", lambda: asyncio.run(main()))
    wall = max(e for _, e in spans) - first
    return {
        "direct_per_s": n / wall,
        "direct_call_p50_ms": statistics.median(e - s for s, e in spans) * 1000,
        "direct_cpu_standin_util": cpu.stop(wall, ["standin"])["cpu_standin_util"],
    }


@contextlib.asynccontextmanager
async def _clients(timeout: float, **kwargs: Any) -> AsyncIterator[list[httpx.AsyncClient]]:
    """32 clients, taken in turn: one httpx pool shared by hundreds of requests costs more
    than the calls themselves."""
    tls = httpx.create_ssl_context()  # one trust store for all: loading it costs more than a call
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                httpx.AsyncClient(timeout=timeout, verify=tls, **kwargs)
            )
            for _ in range(32)
        ]


def _phase(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, its HTTP errors named as this phase's."""
    try:
        return fn()
    except httpx.HTTPError as exc:
        try:
            where = f" ({exc.request.method} {exc.request.url})"
        except RuntimeError:
            where = ""
        raise BenchError(f"{what}: {type(exc).__name__}: {exc or 'no message'}{where}") from None


def bare_burst(
    service: Service, wire: dict[str, Any], n: int, key: str, queue: str, timeout: float
) -> dict[str, float]:
    """N bare tasks sent at once; each records its call's start and end in a Redis list."""
    import redis

    from bench import turns_bench_bare as bare

    results = redis.Redis.from_url(bench_redis_url())
    results.delete(key)
    cpu = Cpu(service.processes)
    cpu.start()
    first = time.time()
    for i in range(n):
        bare.app.send_task(
            "tbench.bare_call",
            args=[key, i, wire["url"], wire["headers"], wire["body"]],
            queue=queue,
        )
    sent = time.time()
    wait_until(
        f"{n} bare tasks ended (Redis list {key})",
        lambda: results.llen(key) >= n,
        timeout,
        service.children,
        every=0.05,
    )
    rows = [json.loads(raw) for raw in results.lrange(key, 0, -1)]
    results.delete(key)
    bad = [r for r in rows if r["status"] != 200]
    if bad:
        raise BenchError(f"{len(bad)} bare calls were not answered 200 (first: {bad[0]})")
    wall = max(r["ended"] for r in rows) - first
    used = cpu.stop(wall, ["standin", "bare_worker"])
    return {
        "bare_per_s": n / wall,
        "bare_send_span_s": sent - first,  # this process sending the N tasks, one after another
        "bare_sent_to_start_p50_ms": statistics.median(r["started"] - first for r in rows) * 1000,
        "bare_call_p50_ms": statistics.median(r["ended"] - r["started"] for r in rows) * 1000,
        "bare_cpu_per_task_ms": used["cpu_bare_worker_s"] / n * 1000,
        **{f"bare_{k}": v for k, v in used.items()},
    }


def orm_turns_queue(names: Sequence[str]) -> tuple[list[int], list[int]]:
    """On each of the agents, what a submit leaves for a worker, written here with the ORM and
    no drain sent: the user's message as the history's first row, a queued turn, the turn's
    trigger link to the message. Returns the turns' ids and the agents'."""
    from django.db import transaction

    from agentops.models import Agent, HistoryRow
    from inference.models import Turn

    agents = list(Agent.objects.filter(name__in=names).order_by("id"))
    if len(agents) != len(names):
        raise BenchError(f"{len(names) - len(agents)} of the ORM tasks' agents do not exist")
    trigger = Turn.trigger_rows.through
    with transaction.atomic():
        messages = HistoryRow.objects.bulk_create(
            [
                HistoryRow(
                    agent=a,
                    seq=1,
                    participant=MESSAGE["participant"],
                    role=HistoryRow.Role.USER,
                    content=MESSAGE["content"],
                )
                for a in agents
            ]
        )
        turns = Turn.objects.bulk_create([Turn(agent=a, status=Turn.Status.QUEUED) for a in agents])
        trigger.objects.bulk_create(
            [
                trigger(turn_id=t.pk, historyrow_id=m.pk)
                for t, m in zip(turns, messages, strict=True)
            ]
        )
    return [t.pk for t in turns], [a.pk for a in agents]


def orm_burst(
    service: Service,
    wire: dict[str, Any],
    names: Sequence[str],
    key: str,
    queue: str,
    timeout: float,
) -> dict[str, float]:
    """N ORM tasks sent at once, each running the queued turn of one of the agents (created
    just before, outside the timed span) and recording its start and end in a
    Redis list, as the bare tasks do. Beat is stopped (SIGSTOP) from before the turns exist
    until they have ended: its sweep would send the service's worker a drain for every agent
    with a queued turn, and the service would run the ORM task's turns."""
    import redis

    from bench import turns_bench_bare as bare

    beat = psutil.Process(service.beat.pid)
    beat.suspend()
    try:
        time.sleep(0.5)  # a sweep beat sent just before runs now, before the turns exist
        turn_ids, agent_ids = orm_turns_queue(names)
        results = redis.Redis.from_url(bench_redis_url())
        results.delete(key)
        cpu = Cpu(service.processes)
        cpu.start()
        first = time.time()
        for i, turn_id in enumerate(turn_ids):
            bare.app.send_task(
                "tbench.orm_turn",
                args=[key, i, turn_id, wire["url"], wire["headers"], wire["body"]],
                queue=queue,
            )
        sent = time.time()
        n = len(turn_ids)
        wait_until(
            f"{n} ORM tasks ended (Redis list {key})",
            lambda: results.llen(key) >= n,
            timeout,
            service.children,
            every=0.05,
        )
        done = [json.loads(raw) for raw in results.lrange(key, 0, -1)]
        results.delete(key)
        wall = max(r["ended"] for r in done) - first
        used = cpu.stop(wall, ["standin", "orm_worker", "postgres"])
    finally:
        beat.resume()
    bad = [r for r in done if r["status"] != 200]
    if bad:
        raise BenchError(f"{len(bad)} ORM tasks' calls were not answered 200 (first: {bad[0]})")
    rows = _orm_rows_check(service, turn_ids, agent_ids)
    return {
        "orm_per_s": n / wall,
        "orm_send_span_s": sent - first,
        "orm_sent_to_start_p50_ms": statistics.median(r["started"] - first for r in done) * 1000,
        "orm_task_p50_ms": statistics.median(r["ended"] - r["started"] for r in done) * 1000,
        "orm_call_p50_ms": _ms([r["call_ended"] - r["sent"] for r in rows.values()])["p50"],
        "orm_call_end_to_turn_end_p50_ms": _ms(
            [r["ended"] - r["call_ended"] for r in rows.values()]
        )["p50"],
        "orm_cpu_per_task_ms": used["cpu_orm_worker_s"] / n * 1000,
        "orm_cpu_postgres_per_task_ms": used["cpu_postgres_s"] / n * 1000,
        **{f"orm_{k}": v for k, v in used.items()},
    }


def _orm_rows_check(
    service: Service, turn_ids: list[int], agent_ids: list[int]
) -> dict[int, dict[str, float]]:
    """The rows the ORM tasks were to write, all there: each turn succeeded with one ended
    call (``_turn_rows``), run by the ORM worker (not by the service's), the answer in each
    agent's history after the message, no lease left."""
    from agentops.models import HistoryRow
    from inference.models import AgentLease, Turn

    rows = _turn_rows(turn_ids)
    if max(r["calls"] for r in rows.values()) != 1:
        raise BenchError("an ORM task's turn has more than one call row")
    others = (
        Turn.objects.filter(pk__in=turn_ids)
        .exclude(claimed_by__startswith=f"{service.orm_name}:")
        .count()
    )
    if others:
        raise BenchError(
            f"{others} of the ORM tasks' turns were claimed by another worker than the ORM worker"
        )
    answers = HistoryRow.objects.filter(
        agent_id__in=agent_ids, seq=2, role=HistoryRow.Role.ASSISTANT
    ).count()
    if answers != len(agent_ids):
        raise BenchError(
            f"{len(agent_ids) - answers} of the ORM tasks' answers are not in their agent's history"
        )
    leases = AgentLease.objects.filter(agent_id__in=agent_ids).count()
    if leases:
        raise BenchError(f"{leases} of the ORM tasks' leases were left behind")
    return rows


async def _submit_all(
    base: str, token: str, names: Sequence[str], timeout: float
) -> tuple[dict[int, float], list[float], int]:
    """One turn to each agent, all at once; a 503 (the web app's database wait, API.md) is
    sent again after a short pause, the submit time staying that of the first attempt."""
    headers = {"authorization": f"Bearer {token}"}
    retries = 0
    async with _clients(timeout, base_url=f"{base}/api/v1", headers=headers) as clients:

        async def one(i: int, name: str) -> tuple[int, float, float]:
            nonlocal retries
            client = clients[i % len(clients)]
            submitted = time.time()
            for _ in range(50):
                response = await client.post(f"/agents/{name}/turns", json={"messages": [MESSAGE]})
                if response.status_code != 503:
                    break
                retries += 1
                await asyncio.sleep(0.2)
            if response.status_code != 202:
                raise BenchError(
                    f"POST /agents/{name}/turns answered {response.status_code}: {response.text[:300]}"
                )
            return int(response.json()["id"]), submitted, time.time() - submitted

        done = await asyncio.gather(*(one(i, name) for i, name in enumerate(names)))
    return (
        {turn_id: submitted for turn_id, submitted, _ in done},
        [latency for _, _, latency in done],
        retries,
    )


def turns_burst(
    service: Service, token: str, names: Sequence[str], timeout: float
) -> dict[str, float]:
    """One turn to each agent through the API, all at once (the issue's end-to-end number)."""
    cpu = Cpu(service.processes)
    cpu.start()
    submitted, post_latency, retries = _phase(
        "the burst's submits", lambda: asyncio.run(_submit_all(service.base, token, names, timeout))
    )
    first = min(submitted.values())
    rows, wall, values = _burst_end(service, "API burst", submitted, first, timeout)
    last_created = max(r["created"] for r in rows.values())
    used = cpu.stop(wall, ["standin", "worker", "web", "beat", "bench", "postgres"])
    return {
        "turns_per_s": len(rows) / wall,
        "submit_to_succeeded_p50_ms": values["submit_to_succeeded"]["p50"],
        "submit_to_succeeded_p99_ms": values["submit_to_succeeded"]["p99"],
        "submit_to_created_p50_ms": values["submit_to_created"]["p50"],
        "created_to_sent_p50_ms": values["created_to_sent"]["p50"],
        "call_duration_p50_ms": values["call"]["p50"],
        "call_end_to_turn_end_p50_ms": values["call_end_to_turn_end"]["p50"],
        "call_end_to_turn_end_p99_ms": values["call_end_to_turn_end"]["p99"],
        # How long the web app took to take them all, and how long the worker ran past that.
        "submit_span_s": last_created - first,
        "last_created_to_last_ended_s": max(r["ended"] for r in rows.values()) - last_created,
        "submit_post_p50_ms": statistics.median(post_latency) * 1000,
        "submit_post_max_ms": max(post_latency) * 1000,
        "submit_503_retries": retries,
        "calls_per_turn_max": max(r["calls"] for r in rows.values()),
        # The machine's CPU a turn used: every process named, and the rest of the machine.
        "api_burst_cpu_per_turn_ms": sum(v for k, v in used.items() if k.endswith("_s"))
        / len(rows)
        * 1000,
        **used,
    }


def web_orm_burst(
    service: Service, token: str, names: Sequence[str], timeout: float
) -> dict[str, float]:
    """One turn to each agent through the ORM view, all at once, as the API burst submits them:
    the view writes each turn and sends the ORM task on commit. Beat is stopped (SIGSTOP)
    until the turns have ended, as for the ORM tasks: its sweep would hand their queued turns
    to the service's worker."""
    import redis

    from agentops.models import Agent

    agent_ids = list(Agent.objects.filter(name__in=names).values_list("id", flat=True))
    beat = psutil.Process(service.beat.pid)
    beat.suspend()
    try:
        time.sleep(0.5)  # a sweep beat sent just before runs now, before the turns exist
        cpu = Cpu(service.processes)
        cpu.start()
        submitted, post_latency, retries = _phase(
            "the ORM view's submits",
            lambda: asyncio.run(_submit_all(service.web_orm_base, token, names, timeout)),
        )
        first = min(submitted.values())
        rows, wall, values = _burst_end(service, "ORM view burst", submitted, first, timeout)
        used = cpu.stop(wall, ["standin", "orm_worker", "web_orm", "bench", "postgres"])
    finally:
        beat.resume()
    redis.Redis.from_url(bench_redis_url()).delete(service.web_orm_key)
    _orm_rows_check(service, list(submitted), agent_ids)
    return {
        "web_orm_per_s": len(rows) / wall,
        "web_orm_submit_to_succeeded_p50_ms": values["submit_to_succeeded"]["p50"],
        "web_orm_submit_to_created_p50_ms": values["submit_to_created"]["p50"],
        "web_orm_created_to_sent_p50_ms": values["created_to_sent"]["p50"],
        "web_orm_call_end_to_turn_end_p50_ms": values["call_end_to_turn_end"]["p50"],
        "web_orm_submit_span_s": max(r["created"] for r in rows.values()) - first,
        "web_orm_submit_post_p50_ms": statistics.median(post_latency) * 1000,
        "web_orm_submit_503_retries": retries,
        "web_orm_cpu_web_per_turn_ms": used["cpu_web_orm_s"] / len(rows) * 1000,
        "web_orm_cpu_worker_per_turn_ms": used["cpu_orm_worker_s"] / len(rows) * 1000,
        "web_orm_cpu_postgres_per_turn_ms": used["cpu_postgres_s"] / len(rows) * 1000,
        "web_orm_cpu_per_turn_ms": sum(v for k, v in used.items() if k.endswith("_s"))
        / len(rows)
        * 1000,
        **{f"web_orm_{k}": v for k, v in used.items()},
    }


def worker_burst(service: Service, names: Sequence[str], timeout: float) -> dict[str, float]:
    """One turn to each agent queued in a single commit, by the service function the API calls
    (``turn_submit``: its drains are enqueued on commit, all at once): the worker's own rate
    with the web app out of the way, comparable to the bare tasks sent at once."""
    from django.db import transaction

    from agentops.models import Agent
    from turns.services import IncomingMessage, turn_submit

    agent_ids = list(Agent.objects.filter(name__in=names).values_list("id", flat=True))
    cpu = Cpu(service.processes)
    cpu.start()
    with transaction.atomic():
        turns = [
            turn_submit(agent_id=a, messages=[IncomingMessage(**MESSAGE)])[0].pk for a in agent_ids
        ]
        first = time.time()  # the commit: the turns exist and their drains go out from here
    sent = time.time()
    rows, wall, values = _burst_end(
        service, "worker burst", dict.fromkeys(turns, first), first, timeout
    )
    used = cpu.stop(wall, ["standin", "worker", "postgres"])
    return {
        "worker_turns_per_s": len(rows) / wall,
        "worker_send_span_s": sent - first,  # the commit and the N drains sent on it
        "worker_cpu_per_turn_ms": used["cpu_worker_s"] / len(rows) * 1000,
        "worker_commit_to_succeeded_p50_ms": values["submit_to_succeeded"]["p50"],
        "worker_commit_to_succeeded_p99_ms": values["submit_to_succeeded"]["p99"],
        "worker_commit_to_sent_p50_ms": _ms([r["sent"] - first for r in rows.values()])["p50"],
        "worker_call_duration_p50_ms": values["call"]["p50"],
        "worker_call_end_to_turn_end_p50_ms": values["call_end_to_turn_end"]["p50"],
        **{f"worker_{k}": v for k, v in used.items()},
    }


def intake_alone(
    service: Service, token: str, names: Sequence[str], timeout: float
) -> dict[str, float]:
    """One turn to each agent through the API, all at once, with the service's worker stopped
    (SIGSTOP): how fast the web app alone accepts turns, a ceiling on the API burst's rate
    whatever the worker costs. The worker is resumed after and runs them, unmeasured."""
    worker = psutil.Process(service.worker.pid)
    cpu = Cpu(service.processes)
    worker.suspend()
    try:
        cpu.start()
        submitted, post_latency, _ = _phase(
            "the intake's submits",
            lambda: asyncio.run(_submit_all(service.base, token, names, timeout)),
        )
        wall = max(
            s + latency for s, latency in zip(submitted.values(), post_latency, strict=True)
        ) - min(submitted.values())
        used = cpu.stop(wall, ["web", "postgres", "bench"])
    finally:
        worker.resume()
    _burst_end(service, "intake, the worker resumed", submitted, min(submitted.values()), timeout)
    return {
        "intake_per_s": len(names) / wall,
        "intake_cpu_web_per_turn_ms": used["cpu_web_s"] / len(names) * 1000,
        "intake_cpu_postgres_per_turn_ms": used["cpu_postgres_s"] / len(names) * 1000,
        "intake_cpu_bench_per_turn_ms": used["cpu_bench_s"] / len(names) * 1000,
    }


def refused(service: Service, names: Sequence[str], timeout: float) -> dict[str, float]:
    """The same POSTs as the intake's, all at once, with a token that does not exist: each is
    answered 401 after the token's one lookup, and runs no view. The web app's CPU for such a
    request is what any request costs it before a submit's own work (a floor under its CPU a
    turn accepted)."""

    async def main() -> list[int]:
        async with _clients(
            timeout,
            base_url=f"{service.base}/api/v1",
            headers={"authorization": "Bearer ao_not-a-token"},
        ) as clients:

            async def one(i: int, name: str) -> int:
                return (
                    await clients[i % len(clients)].post(
                        f"/agents/{name}/turns", json={"messages": [MESSAGE]}
                    )
                ).status_code

            return await asyncio.gather(*(one(i, name) for i, name in enumerate(names)))

    cpu = Cpu(service.processes)
    cpu.start()
    first = time.time()
    statuses = _phase("the refused submits", lambda: asyncio.run(main()))
    wall = time.time() - first
    if set(statuses) != {401}:
        raise BenchError(
            f"a POST with an unknown token was answered {sorted(set(statuses))}, not only 401"
        )
    used = cpu.stop(wall, ["web"])
    return {
        "refused_per_s": len(names) / wall,
        "refused_cpu_web_per_request_ms": used["cpu_web_s"] / len(names) * 1000,
    }


def _burst_end(
    service: Service, what: str, submitted: dict[int, float], first: float, timeout: float
) -> tuple[dict[int, dict[str, float]], float, dict[str, dict[str, float]]]:
    """Wait for every turn to end; their rows, first submit to last end, their timings."""
    from inference.models import Turn

    ids = list(submitted)

    def all_ended() -> bool:
        return Turn.objects.filter(pk__in=ids, status__in=Turn.ENDED).count() == len(ids)

    try:
        wait_until(
            f"{what}: all {len(ids)} turns ended",
            all_ended,
            timeout,
            service.children,
            every=BURST_POLL_S,
        )
    except BenchError as exc:
        statuses = Turn.objects.filter(pk__in=ids).values_list("status", flat=True)
        raise BenchError(f"{exc} (statuses: {_counts(statuses)})") from None
    rows = _turn_rows(ids)
    return rows, max(r["ended"] for r in rows.values()) - first, _turn_values(rows, submitted)


def lone(service: Service, token: str, name: str, count: int, timeout: float) -> dict[str, float]:
    """Turns one at a time on one agent, each once the one before has succeeded."""
    from inference.models import Turn

    submitted: dict[int, float] = {}
    observed: dict[int, float] = {}
    with httpx.Client(
        base_url=f"{service.base}/api/v1",
        headers={"authorization": f"Bearer {token}"},
        timeout=timeout,
    ) as client:
        for i in range(count):
            start = time.time()
            response = client.post(f"/agents/{name}/turns", json={"messages": [MESSAGE]})
            if response.status_code != 202:
                raise BenchError(
                    f"lone turn {i + 1}: POST /agents/{name}/turns answered {response.status_code}: {response.text[:300]}"
                )
            turn_id = int(response.json()["id"])
            submitted[turn_id] = start
            end = time.monotonic() + timeout
            while (
                status := Turn.objects.values_list("status", flat=True).get(pk=turn_id)
            ) not in Turn.ENDED:
                if time.monotonic() > end:
                    service.children.check()
                    raise BenchError(
                        f"lone turn {i + 1} (turn {turn_id}) not ended within {timeout:g} s (status {status})"
                    )
                time.sleep(LONE_POLL_S)
            observed[turn_id] = time.time()
    rows = _turn_rows(list(submitted))
    values = _turn_values(rows, submitted)
    beyond = [
        rows[t]["ended"] - submitted[t] - (rows[t]["call_ended"] - rows[t]["sent"]) for t in rows
    ]
    beyond_seen = [
        observed[t] - submitted[t] - (rows[t]["call_ended"] - rows[t]["sent"]) for t in rows
    ]
    return {
        "lone_beyond_call_p50_ms": _ms(beyond)["p50"],
        "lone_beyond_call_p99_ms": _ms(beyond)["p99"],
        "lone_beyond_call_client_observed_p50_ms": _ms(beyond_seen)["p50"],
        "lone_submit_to_succeeded_p50_ms": values["submit_to_succeeded"]["p50"],
        "lone_submit_to_created_p50_ms": values["submit_to_created"]["p50"],
        "lone_created_to_sent_p50_ms": values["created_to_sent"]["p50"],
        "lone_call_duration_p50_ms": values["call"]["p50"],
        "lone_call_end_to_turn_end_p50_ms": values["call_end_to_turn_end"]["p50"],
    }


def _counts(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def _turn_rows(ids: list[int]) -> dict[int, dict[str, float]]:
    """Per turn, in unix seconds: created, ended, its first call's sent and its last call's
    ended, and its number of calls. Every turn must have succeeded."""
    from inference.models import InferenceCall, Turn

    turns = {
        t["id"]: t
        for t in Turn.objects.filter(pk__in=ids).values(
            "id", "status", "created_at", "ended_at", "error"
        )
    }
    failed = {t: row for t, row in turns.items() if row["status"] != Turn.Status.SUCCEEDED}
    if failed:
        first = next(iter(failed.values()))
        raise BenchError(
            f"{len(failed)} turns did not succeed ({_counts(r['status'] for r in failed.values())}; first: turn {first['id']}, {first['error']})"
        )
    calls: dict[int, list[tuple[datetime | None, datetime | None]]] = {}
    for turn_id, sent_at, ended_at in (
        InferenceCall.objects.filter(turn_id__in=ids)
        .order_by("id")
        .values_list("turn_id", "sent_at", "ended_at")
    ):
        calls.setdefault(int(turn_id or 0), []).append((sent_at, ended_at))
    rows = {}
    for turn_id, turn in turns.items():
        own = calls.get(turn_id) or []
        sent, call_ended, ended = (
            (own[0][0] if own else None),
            (own[-1][1] if own else None),
            turn["ended_at"],
        )
        if sent is None or call_ended is None or ended is None:
            raise BenchError(
                f"turn {turn_id} succeeded without an ended_at, or without a sent and ended call row"
            )
        rows[turn_id] = {
            "created": turn["created_at"].timestamp(),
            "ended": ended.timestamp(),
            "sent": sent.timestamp(),
            "call_ended": call_ended.timestamp(),
            "calls": len(own),
        }
    return rows


def _turn_values(
    rows: dict[int, dict[str, float]], submitted: dict[int, float]
) -> dict[str, dict[str, float]]:
    return {
        "submit_to_succeeded": _ms([r["ended"] - submitted[t] for t, r in rows.items()]),
        "submit_to_created": _ms([r["created"] - submitted[t] for t, r in rows.items()]),
        "created_to_sent": _ms([r["sent"] - r["created"] for r in rows.values()]),
        "call": _ms([r["call_ended"] - r["sent"] for r in rows.values()]),
        "call_end_to_turn_end": _ms([r["ended"] - r["call_ended"] for r in rows.values()]),
    }


# --- setting up agents through the API ---------------------------------------------------------


def api_create(
    base: str, token: str, path: str, bodies: Sequence[dict[str, Any]], timeout: float
) -> None:
    async def main() -> None:
        gate = asyncio.Semaphore(16)
        async with httpx.AsyncClient(
            base_url=f"{base}/api/v1", headers={"authorization": f"Bearer {token}"}, timeout=timeout
        ) as client:

            async def one(body: dict[str, Any]) -> None:
                async with gate:
                    response = await client.post(path, json=body)
                if response.status_code != 201:
                    raise BenchError(
                        f"POST {path} {body.get('name')!r} answered {response.status_code}: {response.text[:300]}"
                    )

            await asyncio.gather(*(one(body) for body in bodies))

    asyncio.run(main())


def agent_bodies(names: Sequence[str], stream: bool) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "provider": "standin",
            "model": MODEL,
            "stream": stream,
            "max_tokens": MAX_TOKENS,
        }
        for name in names
    ]


def warm_up(service: Service, token: str, timeout: float) -> dict[str, dict[str, Any]]:
    """One turn per mode (the worker's first call, the web app's first request), which also
    gives the exact wire request the worker sent, as the stand-in recorded it: the bare tasks
    and the direct calls send that one."""
    wires: dict[str, dict[str, Any]] = {}
    for mode, stream in MODES.items():
        name = f"warm-{mode}"
        api_create(service.base, token, "/agents", agent_bodies([name], stream), timeout)
        lone(service, token, name, 1, timeout)
        recorded = httpx.get(f"{service.standin_url}/_standin/requests", timeout=10).json()
        last = next(
            r
            for r in reversed(recorded)
            if isinstance(r["body"], dict) and r["body"].get("stream") is stream
        )
        headers = {
            k: v
            for k, v in last["headers"].items()
            if k in ("content-type", "accept", "authorization")
        }
        wires[mode] = {
            "url": f"{service.standin_url}{last['path']}",
            "headers": headers,
            "body": last["body"],
        }
    return wires


# --- one run, the summary ----------------------------------------------------------------------


def one_run(
    service: Service,
    token: str,
    wires: dict[str, dict[str, Any]],
    run: int,
    args: argparse.Namespace,
    queues: Queues,
) -> dict[str, float]:
    out: dict[str, float] = {}
    for mode, stream in MODES.items():
        values = one_mode(
            service,
            token,
            wires[mode],
            f"run {run + 1}, {mode}",
            f"r{run}-{mode}",
            stream,
            args,
            queues,
        )
        out.update({f"{mode}.{k}": v for k, v in values.items()})
    return out


def one_mode(
    service: Service,
    token: str,
    wire: dict[str, Any],
    label: str,
    prefix: str,
    stream: bool,
    args: argparse.Namespace,
    queues: Queues,
) -> dict[str, float]:
    names = [f"{prefix}-{i}" for i in range(args.agents)]
    worker_names = [f"{prefix}-w{i}" for i in range(args.agents)]
    intake_names = [f"{prefix}-i{i}" for i in range(args.agents)]
    orm_names = [f"{prefix}-o{i}" for i in range(args.agents)]
    web_orm_names = [f"{prefix}-v{i}" for i in range(args.agents)]
    lone_name = f"{prefix}-lone"

    def create() -> dict[str, float]:
        api_create(
            service.base,
            token,
            "/agents",
            agent_bodies(
                [*names, *worker_names, *intake_names, *orm_names, *web_orm_names, lone_name],
                stream,
            ),
            args.timeout,
        )
        return {}

    phases: list[tuple[str, Callable[[], dict[str, float]]]] = [
        ("creating the agents", create),
        ("direct calls", lambda: direct(service.processes, wire, args.agents, args.timeout)),
        (
            "bare tasks",
            lambda: bare_burst(
                service, wire, args.agents, f"{TAG}:{prefix}", queues.bare, args.timeout
            ),
        ),
        (
            "ORM tasks",
            lambda: orm_burst(
                service, wire, orm_names, f"{TAG}:{prefix}:orm", queues.orm, args.timeout
            ),
        ),
        ("ORM view", lambda: web_orm_burst(service, token, web_orm_names, args.timeout)),
        ("API burst", lambda: turns_burst(service, token, names, args.timeout)),
        ("worker burst", lambda: worker_burst(service, worker_names, args.timeout)),
        ("intake alone", lambda: intake_alone(service, token, intake_names, args.timeout)),
        ("refused requests", lambda: refused(service, intake_names, args.timeout)),
        ("lone turns", lambda: lone(service, token, lone_name, args.lone, args.timeout)),
    ]
    values: dict[str, float] = {}
    for what, phase in phases:
        DOING[0] = f"{label}: {what}"
        values.update(_phase(what, phase))
        time.sleep(1)  # the service settles between phases
    values["ratio_turns_to_bare"] = values["turns_per_s"] / values["bare_per_s"]
    values["ratio_worker_turns_to_bare"] = values["worker_turns_per_s"] / values["bare_per_s"]
    values["ratio_intake_to_bare"] = values["intake_per_s"] / values["bare_per_s"]
    values["turns_to_orm"] = values["turns_per_s"] / values["orm_per_s"]
    values["turns_to_web_orm"] = values["turns_per_s"] / values["web_orm_per_s"]
    values["worker_to_orm"] = values["worker_turns_per_s"] / values["orm_per_s"]
    values["turns_to_direct"] = values["turns_per_s"] / values["direct_per_s"]
    # The target rate (TARGETS: a share of the bare or of the ORM tasks' rate), the machine's
    # CPU a turn can use at it (every core busy), against what a turn of the API burst used
    # (api_burst_cpu_per_turn_ms).
    baseline, share = TARGETS["streamed" if stream else "non_streamed"]
    values["target_turns_per_s"] = share * values[f"{baseline}_per_s"]
    values["target_cpu_budget_per_turn_ms"] = (
        (os.cpu_count() or 1) * 1000 / values["target_turns_per_s"]
    )
    return values


def standin_verdict(median: dict[str, float]) -> dict[str, str]:
    """Whether the stand-in limited a burst: it is one process on one event loop, so a burst
    it limited kept it near a full core busy, or ran near its own direct rate."""
    verdicts = {}
    for mode in MODES:
        util = {
            what: median[f"{mode}.{key}"]
            for what, key in (
                ("API burst", "cpu_standin_util"),
                ("worker burst", "worker_cpu_standin_util"),
                ("bare tasks", "bare_cpu_standin_util"),
            )
        }
        share = (
            max(median[f"{mode}.turns_per_s"], median[f"{mode}.worker_turns_per_s"])
            / median[f"{mode}.direct_per_s"]
        )
        busy = [what for what, u in util.items() if u >= STANDIN_LIMIT_UTIL]
        used = ", ".join(f"{u:.0%} of a core during the {what}" for what, u in util.items())
        if busy or share >= 0.8:
            verdicts[mode] = (
                f"the stand-in MAY HAVE BEEN THE LIMIT ({', '.join(busy) or 'the turns ran near its direct rate'}): it used {used}; the turns ran at {share:.0%} of its direct rate"
            )
        else:
            verdicts[mode] = (
                f"the stand-in was not the limit: it used {used}; the faster turn burst ran at {share:.0%} of its direct rate"
            )
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--lone", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300, help="seconds any one wait may take")
    args = parser.parse_args()
    # SIGTERM (a supervisor, a timeout) stops the processes this run started, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    prepare_database()
    os.environ.update(
        DATABASE_URL=bench_database_url(),
        REDIS_URL=bench_redis_url(),
        DJANGO_SETTINGS_MODULE="agentops.settings",
    )
    queues = Queues(f"{TAG}-service", f"{TAG}-bare", f"{TAG}-orm")
    os.environ["AGENTOPS_CELERY_QUEUE"] = queues.service
    import django
    from django.conf import settings

    django.setup()
    # This process queues turns with the service's own function (``worker_burst``): its live
    # events go out through a runtime, built here as every entry point builds its own.
    from agentops.runtime import serving
    from turns.runtime import TurnRuntime

    served = contextlib.ExitStack()  # stopped in the ``finally`` below
    served.enter_context(serving(TurnRuntime(worker=False)))
    # The bare and ORM workers get the service's Celery settings, each with its own queue.
    bare_conf = {
        k.removeprefix("CELERY_").lower(): getattr(settings, k)
        for k in dir(settings)
        if k.startswith("CELERY_") and k != "CELERY_BEAT_SCHEDULE"
    }
    bare_conf["task_default_queue"] = queues.bare
    orm_conf = dict(bare_conf, task_default_queue=queues.orm)
    os.environ["TBENCH_CELERY_CONF"] = json.dumps(
        bare_conf
    )  # read when the bench imports the bare app to send with it

    logs = Path(tempfile.mkdtemp(prefix=f"{TAG}-"))
    children = Children(logs)
    ok = False
    results: list[dict[str, float]] = []
    try:
        service = Service(children, queues.service, bare_conf, orm_conf)
        from agentops.tokens import api_token_create

        token = api_token_create(name=TAG, operator=True)[1]
        api_create(
            service.base,
            token,
            "/providers",
            [{"name": "standin", "kind": "openai", "base_url": f"{service.standin_url}/v1"}],
            args.timeout,
        )
        DOING[0] = "warming up"
        wires = warm_up(service, token, args.timeout)
        service.start_web_orm(wires, f"{TAG}:web-orm")
        # The bare and ORM workers', the ORM view's and this process's first calls, not measured.
        for mode, stream in MODES.items():
            bare_burst(service, wires[mode], 10, f"{TAG}:warm:{mode}", queues.bare, args.timeout)
            warm_orm = [f"warm-orm-{mode}-{i}" for i in range(10)]
            api_create(service.base, token, "/agents", agent_bodies(warm_orm, stream), args.timeout)
            orm_burst(
                service, wires[mode], warm_orm, f"{TAG}:warm:{mode}:orm", queues.orm, args.timeout
            )
            warm_web = [f"warm-web-{mode}-{i}" for i in range(10)]
            api_create(service.base, token, "/agents", agent_bodies(warm_web, stream), args.timeout)
            web_orm_burst(service, token, warm_web, args.timeout)
            direct(service.processes, wires[mode], 10, args.timeout)
        for run in range(args.repeat):
            values = one_run(service, token, wires, run, args, queues)
            print(
                f"run {run + 1}: {json.dumps({k: round(v, 3) for k, v in values.items()})}",
                flush=True,
            )
            results.append(values)
        ok = True
    except (BenchError, httpx.HTTPError) as exc:
        raise SystemExit(
            f"turns bench stopped while {DOING[0]}: {type(exc).__name__}: {exc}\n(the processes' logs: {logs})"
        ) from None
    except KeyboardInterrupt:
        raise SystemExit(
            f"turns bench: interrupted while {DOING[0]} (the processes' logs: {logs})"
        ) from None
    finally:
        children.stop()
        served.close()
        _redis_cleanup(*queues)
        problems = _log_problems(logs)
        if ok:
            shutil.rmtree(logs, ignore_errors=True)
    report(args, results, service.pools, problems)


def _log_problems(logs: Path) -> dict[str, Any]:
    """Per process log, how many lines say ERROR or Traceback, and the first few of them."""
    found: dict[str, Any] = {}
    for log in sorted(logs.glob("*.log")):
        lines = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if "ERROR" in line or "Traceback" in line
        ]
        if lines:
            found[log.stem] = {"lines": len(lines), "first": [line[:300] for line in lines[:5]]}
    return found


def _redis_cleanup(*queues: str) -> None:
    """Only what this run made: its queues and their bindings, its result lists."""
    import redis

    client = redis.Redis.from_url(bench_redis_url())
    try:
        for pattern in (f"{TAG}*", *(f"*{queue}*" for queue in queues)):
            for key in client.scan_iter(match=pattern, count=500):
                client.delete(key)
    except redis.RedisError as exc:
        print(f"could not remove this run's Redis keys: {exc}", file=sys.stderr)


def report(
    args: argparse.Namespace,
    results: list[dict[str, float]],
    pools: dict[str, str],
    problems: dict[str, Any],
) -> None:
    median = {k: statistics.median(r[k] for r in results) for k in results[0]}
    verdicts = standin_verdict(median)
    summary = {
        "what": (
            "issue 15, turn throughput: turns/s vs a bare Celery task's calls/s, an ORM Celery "
            "task's turns/s and turns/s through an ORM view in front of it, in the same run; "
            "a lone turn beyond its call"
        ),
        "targets": {
            **{
                mode: f"API burst turns/s >= {share} x the rate of the {BASELINE_NAMES[baseline]}"
                for mode, (baseline, share) in TARGETS.items()
            },
            "lone": f"a lone turn beyond its call p50 <= {LONE_TARGET_MS} ms",
        },
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "agents": args.agents,
        "lone": args.lone,
        "runs": args.repeat,
        "worker_pool": pools,
        "cpus": os.cpu_count(),
        "lone_measured_as": "submit: this process's clock just before the POST; succeeded: the turn's ended_at (same clock)",
        "standin": verdicts,
        "log_errors": problems,
        "median": median,
        "each_run": {k: [r[k] for r in results] for k in results[0]},
    }
    print(json.dumps(summary, indent=2))
    print()
    for mode in MODES:
        m = median

        def runs(key: str, mode: str = mode, digits: int = 1) -> str:
            return ", ".join(f"{r[f'{mode}.{key}']:.{digits}f}" for r in results)

        def at(key: str, mode: str = mode, digits: int = 1) -> str:
            return f"{median[f'{mode}.{key}']:.{digits}f}"

        baseline, share = TARGETS[mode]
        print(
            f"{mode}: turns through the API {m[f'{mode}.turns_per_s']:.1f}/s ({runs('turns_per_s')}), bare tasks {m[f'{mode}.bare_per_s']:.1f}/s "
            f"({runs('bare_per_s')}), ORM tasks {at('orm_per_s')}/s ({runs('orm_per_s')}), "
            f"turns through the ORM view {at('web_orm_per_s')}/s ({runs('web_orm_per_s')}), "
            f"direct calls {at('direct_per_s')}/s ({runs('direct_per_s')}); "
            f"target: turns >= {share:g} x the rate of the {BASELINE_NAMES[baseline]}, "
            f"{at('target_turns_per_s')}/s"
        )
        print(
            f"  turns/bare {at('ratio_turns_to_bare', digits=2)} "
            f"({runs('ratio_turns_to_bare', digits=2)}), "
            f"turns/ORM {at('turns_to_orm', digits=2)} ({runs('turns_to_orm', digits=2)}), "
            f"turns/ORM view {at('turns_to_web_orm', digits=2)} "
            f"({runs('turns_to_web_orm', digits=2)}); "
            f"turns queued in one commit {m[f'{mode}.worker_turns_per_s']:.1f}/s ({runs('worker_turns_per_s')}), /bare {m[f'{mode}.ratio_worker_turns_to_bare']:.2f} "
            f"({runs('ratio_worker_turns_to_bare', digits=2)}), /ORM {m[f'{mode}.worker_to_orm']:.2f} ({runs('worker_to_orm', digits=2)})"
        )
        print(
            f"  API burst: submit to succeeded p50 {m[f'{mode}.submit_to_succeeded_p50_ms']:.0f} ms, p99 {m[f'{mode}.submit_to_succeeded_p99_ms']:.0f} ms; "
            f"submit to created p50 {m[f'{mode}.submit_to_created_p50_ms']:.0f} ms (all taken in {m[f'{mode}.submit_span_s']:.1f} s, {m[f'{mode}.submit_503_retries']:.0f} 503s), "
            f"created to sent p50 {m[f'{mode}.created_to_sent_p50_ms']:.0f} ms, call p50 {m[f'{mode}.call_duration_p50_ms']:.1f} ms, "
            f"call end to turn end p50 {m[f'{mode}.call_end_to_turn_end_p50_ms']:.1f} ms"
        )
        print(
            f"  worker burst: commit to succeeded p50 {m[f'{mode}.worker_commit_to_succeeded_p50_ms']:.0f} ms, p99 {m[f'{mode}.worker_commit_to_succeeded_p99_ms']:.0f} ms; "
            f"commit to sent p50 {m[f'{mode}.worker_commit_to_sent_p50_ms']:.0f} ms, call end to turn end p50 {m[f'{mode}.worker_call_end_to_turn_end_p50_ms']:.0f} ms; "
            f"worker CPU {m[f'{mode}.worker_cpu_per_turn_ms']:.1f} ms a turn ({m[f'{mode}.worker_cpu_worker_s']:.1f} s in {args.agents / m[f'{mode}.worker_turns_per_s']:.1f} s), "
            f"bare worker {m[f'{mode}.bare_cpu_per_task_ms']:.1f} ms a task"
        )
        print(
            f"  ORM tasks: ORM worker CPU {m[f'{mode}.orm_cpu_per_task_ms']:.1f} ms a task ({runs('orm_cpu_per_task_ms')}), postgres (bench db) "
            f"{m[f'{mode}.orm_cpu_postgres_per_task_ms']:.1f} ms a task; task p50 {m[f'{mode}.orm_task_p50_ms']:.1f} ms, its call p50 {m[f'{mode}.orm_call_p50_ms']:.1f} ms, "
            f"call end to turn end p50 {m[f'{mode}.orm_call_end_to_turn_end_p50_ms']:.1f} ms"
        )
        print(
            f"  ORM view: submit to succeeded p50 "
            f"{at('web_orm_submit_to_succeeded_p50_ms', digits=0)} ms, submit to created p50 "
            f"{at('web_orm_submit_to_created_p50_ms', digits=0)} ms "
            f"(all taken in {at('web_orm_submit_span_s')} s); CPU a turn: its web app "
            f"{at('web_orm_cpu_web_per_turn_ms')} ms, the ORM worker "
            f"{at('web_orm_cpu_worker_per_turn_ms')} ms, postgres "
            f"{at('web_orm_cpu_postgres_per_turn_ms')} ms, every process "
            f"{at('web_orm_cpu_per_turn_ms')} ms ({runs('web_orm_cpu_per_turn_ms')})"
        )
        print(
            f"  the web app alone (worker stopped): {m[f'{mode}.intake_per_s']:.1f} turns accepted/s ({runs('intake_per_s')}), "
            f"/bare {m[f'{mode}.ratio_intake_to_bare']:.2f} ({runs('ratio_intake_to_bare', digits=2)}); CPU a turn: web "
            f"{m[f'{mode}.intake_cpu_web_per_turn_ms']:.1f} ms, postgres {m[f'{mode}.intake_cpu_postgres_per_turn_ms']:.1f} ms, "
            f"this bench {m[f'{mode}.intake_cpu_bench_per_turn_ms']:.1f} ms"
        )
        print(
            f"  a request refused 401 (no view): web CPU {m[f'{mode}.refused_cpu_web_per_request_ms']:.1f} ms ({runs('refused_cpu_web_per_request_ms')}); "
            f"the machine's CPU a turn at the target (cores / the target rate) {m[f'{mode}.target_cpu_budget_per_turn_ms']:.1f} ms, "
            f"used a turn in the API burst {m[f'{mode}.api_burst_cpu_per_turn_ms']:.1f} ms ({runs('api_burst_cpu_per_turn_ms')})"
        )
        print(
            f"  CPU during the API burst: worker {m[f'{mode}.cpu_worker_s']:.1f} s, web {m[f'{mode}.cpu_web_s']:.1f} s, stand-in {m[f'{mode}.cpu_standin_s']:.1f} s, "
            f"postgres (bench db) {m[f'{mode}.cpu_postgres_s']:.1f} s, this bench {m[f'{mode}.cpu_bench_s']:.1f} s, the rest of the machine {m[f'{mode}.cpu_others_s']:.1f} s"
        )
        print(
            f"  lone turn beyond its call p50 {m[f'{mode}.lone_beyond_call_p50_ms']:.1f} ms ({runs('lone_beyond_call_p50_ms')}), "
            f"p99 {m[f'{mode}.lone_beyond_call_p99_ms']:.1f} ms (target p50 <= {LONE_TARGET_MS} ms; submit before the POST to the turn's ended_at)"
        )
        print(f"  {verdicts[mode]}")
    for name, found in problems.items():
        print(
            f"the {name} process logged {found['lines']} ERROR/Traceback lines, first: {found['first'][0]}"
        )
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"turns-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nwritten to {out.relative_to(BASE_DIR)}")


def _git_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=BASE_DIR, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return done.stdout.strip() + ("-dirty" if dirty else "")


if __name__ == "__main__":
    main()
