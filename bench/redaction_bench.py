"""Benchmark: what redacting provider keys costs (architecture.md §15, docs/performance.md).

Three figures, each the best of ``--repeat`` timeit runs, in microseconds a call:
- the test every stream event passes (``'"error"' in data``), on a typical content delta;
- ``provider_keys()``: the environment read for the keys, with ``--vars`` variables set
  (two of them keys);
- ``secrets_redacted`` on a typical 401 message that quotes a key (what each failed call's
  error, body and error frame costs), and on one with nothing to redact.

Run: ``python -m devtools.launcher exec -- python bench/redaction_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")

import django

django.setup()

from agentops.providers import provider_keys, secrets_redacted  # noqa: E402

KEY = "sk-proj-" + "Q" * 156  # an OpenAI project key's length


def best_us(fn: object, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vars", type=int, default=80)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for i in range(max(0, args.vars - len(os.environ) - 2)):
        os.environ[f"BENCH_FILLER_{i}"] = "x" * 40
    os.environ["BENCH_OPENAI_API_KEY"] = KEY
    os.environ["BENCH_ANTHROPIC_API_KEY"] = "sk-ant-api03-" + "R" * 95
    delta = (
        'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-5-mini",'
        '"choices":[{"index":0,"delta":{"content":" the"},"finish_reason":null}]}'
    )
    refusal = json.dumps(
        {
            "error": {
                "message": f"Incorrect API key provided: authorization: Bearer {KEY}. You can "
                "find your API key at https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        }
    )
    clean = refusal.replace(KEY, "nothing").replace("Bearer", "with")
    figures = {
        "environment_variables": len(os.environ),
        "event_test_us": best_us(lambda: '"error"' in delta, 1_000_000, args.repeat),
        "provider_keys_us": best_us(provider_keys, 20_000, args.repeat),
        "redact_refusal_us": best_us(lambda: secrets_redacted(refusal), 20_000, args.repeat),
        "redact_clean_us": best_us(lambda: secrets_redacted(clean), 20_000, args.repeat),
    }
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}, indent=1))


if __name__ == "__main__":
    main()
