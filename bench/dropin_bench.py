"""Benchmark: the latency ``POST /v1/chat/completions`` adds over a direct call to the stand-in,
against LiteLLM's proxy forwarding the same request to the same stand-in, in the same run.

Three targets answer the same non-streamed chat completion (the stand-in's ``answer``): the
stand-in itself (direct), agentops' drop-in endpoint (one uvicorn process, the production
settings: the default connection pool of 10, a real PostgreSQL and Redis) and LiteLLM's proxy
(one process, no database). Sequentially the three are asked in turn, request by request, so
noise falls on all alike; at 20 in flight each target gets its own burst, in rotating order.
Added latency = the target's latency quantile minus the direct quantile of the same phase.

LiteLLM is not a project dependency: install it in an environment of its own, outside the
repository, and name its ``litellm`` command (no database, no key)::

    python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]'
    LITELLM_BIN=/tmp/litellm-venv/bin/litellm python -m devtools.launcher exec -- \\
        .venv/bin/python bench/dropin_bench.py

A fourth target, ``alternates``, is the drop-in endpoint for an agent with an alternate
configured that is never used (the primary answers): its added latency against ``agentops``'
is what alternates cost a request that needs none. Without ``LITELLM_BIN`` the LiteLLM target
is left out.

Options: ``--requests 300`` per target and phase, ``--concurrency 20``, ``--repeat 3``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.web import bench_database_url, free_port, quantiles, uvicorn, wait_up  # noqa: E402

DATABASE = os.environ.get("BENCH_DATABASE", "agentops_dropin_bench")
MESSAGES = [{"role": "user", "content": "hello"}]


def prepare_database() -> None:
    import psycopg

    admin = urlsplit(os.environ["DATABASE_URL"])._replace(path="/postgres")
    with psycopg.connect(urlunsplit(admin), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=BASE_DIR,
        check=True,
        env=dict(os.environ, DATABASE_URL=bench_database_url(DATABASE)),
    )


SEED = r"""
import django, json, sys
django.setup()
from agentops.models import Agent, ApiToken, Provider
from agentops.tokens import api_token_create
from inference.models import InferenceCall
InferenceCall.objects.all().delete()
Agent.objects.filter(name__in=["bench", "bench-alternates"]).delete()
provider, _ = Provider.objects.update_or_create(name="bench-standin", defaults={"kind": "openai", "base_url": sys.argv[1] + "/v1"})
Agent.objects.create(name="bench", provider=provider, model="answer", participant="bench", max_tokens=16)
# The same agent with alternates configured (none used: the primary answers).
from agentops.services import fallbacks_checked
Agent.objects.create(name="bench-alternates", provider=provider, model="answer", participant="bench", max_tokens=16, fallbacks=fallbacks_checked([{"provider": "bench-standin", "model": "answer:text=alternate"}], model="answer", provider="bench-standin", max_tokens=16))
print(api_token_create(name="bench", operator=False)[1])
"""


MASTER_KEY = "sk-bench-" + "0" * 32


def start_servers(
    litellm: str | None, procs: list[subprocess.Popen[bytes]]
) -> dict[str, tuple[str, dict[str, str], str]]:
    standin = subprocess.Popen(
        [sys.executable, "-m", "devtools.standin", "--port", "0"],
        cwd=BASE_DIR,
        stdout=subprocess.PIPE,
    )
    procs.append(standin)
    assert standin.stdout is not None
    standin_url = standin.stdout.readline().decode().strip().removeprefix("standin listening on ")
    env = dict(
        os.environ,
        DATABASE_URL=bench_database_url(DATABASE),
        DJANGO_SETTINGS_MODULE="agentops.settings",
        AGENTOPS_LOG_LEVEL="WARNING",
    )
    token = (
        subprocess.run(
            [sys.executable, "-c", SEED, standin_url],
            cwd=BASE_DIR,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    port = free_port()
    agentops = uvicorn(port, env)
    procs.append(agentops)
    wait_up(f"http://127.0.0.1:{port}/health", agentops, "agentops")
    targets = {
        "direct": (f"{standin_url}/v1/chat/completions", {}, "answer"),
        "agentops": (
            f"http://127.0.0.1:{port}/v1/chat/completions",
            {"authorization": f"Bearer {token}"},
            "bench",
        ),
        "alternates": (
            f"http://127.0.0.1:{port}/v1/chat/completions",
            {"authorization": f"Bearer {token}"},
            "bench-alternates",
        ),
    }
    if litellm is None:
        return targets
    lport = free_port()
    config = Path(tempfile.mkdtemp()) / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/answer\n"
        f"      api_base: {standin_url}/v1\n      api_key: x\n"
    )
    # With a master key (it refuses to start without one), checked in memory: no database.
    lenv = dict(
        os.environ,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        LITELLM_MASTER_KEY=MASTER_KEY,
    )
    lenv.pop("DATABASE_URL", None)  # LiteLLM's proxy would use it: it runs without a database here
    proxy = subprocess.Popen(
        [litellm, "--config", str(config), "--port", str(lport), "--num_workers", "1"],
        env=lenv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(proxy)
    wait_up(f"http://127.0.0.1:{lport}/health/liveliness", proxy, "litellm")
    targets["litellm"] = (
        f"http://127.0.0.1:{lport}/v1/chat/completions",
        {"authorization": f"Bearer {MASTER_KEY}"},
        "bench",
    )
    return targets


def sequential(
    targets: dict[str, tuple[str, dict[str, str], str]], n: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                url, headers, model = targets[name]
                start = time.perf_counter()
                response = client.post(
                    url,
                    headers=headers,
                    json={"model": model, "messages": MESSAGES, "max_tokens": 16},
                )
                elapsed = (time.perf_counter() - start) * 1000
                assert response.status_code == 200, (
                    name,
                    response.status_code,
                    response.text[:300],
                )
                times[name].append(elapsed)
    return times


async def _burst(target: tuple[str, dict[str, str], str], n: int, concurrency: int) -> list[float]:
    url, headers, model = target
    times: list[float] = []
    left = [n]
    async with httpx.AsyncClient(
        timeout=60, limits=httpx.Limits(max_connections=concurrency * 2)
    ) as client:

        async def one_lane() -> None:
            while left[0] > 0:
                left[0] -= 1
                start = time.perf_counter()
                response = await client.post(
                    url,
                    headers=headers,
                    json={"model": model, "messages": MESSAGES, "max_tokens": 16},
                )
                times.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, (url, response.status_code, response.text[:300])

        await asyncio.gather(*(one_lane() for _ in range(concurrency)))
    return times


def concurrent(
    targets: dict[str, tuple[str, dict[str, str], str]], n: int, concurrency: int, run: int
) -> dict[str, list[float]]:
    names = list(targets)
    order = names[run % len(names) :] + names[: run % len(names)]
    times: dict[str, list[float]] = {name: [] for name in names}
    # Two rounds each, in rotating order, so no target always follows the same one.
    for _ in range(2):
        for name in order:
            times[name] += asyncio.run(_burst(targets[name], n // 2, concurrency))
    return times


def added(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    direct = quantiles(times["direct"])
    out = {"direct": direct}
    for name in times:
        if name == "direct":
            continue
        q = quantiles(times[name])
        out[name] = {k: q[k] - direct[k] for k in q}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    litellm = os.environ.get("LITELLM_BIN") or None
    if litellm is None:
        print("LITELLM_BIN not set: the LiteLLM target is left out (see the docstring)")
    prepare_database()
    procs: list[subprocess.Popen[bytes]] = []
    runs = []
    try:
        targets = start_servers(litellm, procs)
        sequential(targets, 30)  # warm-up: connections, caches, first imports
        asyncio.run(_burst(targets["agentops"], 40, args.concurrency))
        for run in range(args.repeat):
            result = {
                "sequential": added(sequential(targets, args.requests)),
                "concurrent": added(concurrent(targets, args.requests, args.concurrency, run)),
            }
            print(f"run {run + 1}: {json.dumps(result)}", flush=True)
            runs.append(result)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    median = {
        phase: {
            name: {
                k: statistics.median(r[phase][name][k] for r in runs) for k in ("p50", "p95", "p99")
            }
            for name in runs[0][phase]
        }
        for phase in ("sequential", "concurrent")
    }
    print(
        json.dumps(
            {
                "requests": args.requests,
                "concurrency": args.concurrency,
                "runs": args.repeat,
                "median_added_ms": median,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
