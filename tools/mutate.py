"""Mutation testing of the pure cores (``make mutate``).

Each core is mutated alone (mutmut 3) against its own test file(s) only, so a core's score says
how well *its* tests pin it, not how much of it some wider test happens to run. One core at a
time and one mutant at a time (``--max-children 1``): the machine is shared.

Each core gets a scratch directory, ``mutants/<core>/``, holding links to the packages and the
tests and a ``pyproject.toml`` (the project's own plus a ``[tool.mutmut]`` section for that core);
mutmut works in ``mutants/<core>/mutants/``. Every run starts from scratch, so a result never
stands on a stale cache of an older test file.

A mutant that changes no behaviour (an equivalent mutant) can never be killed. Those left are
listed, with why, in ``tools/mutate_equivalents.md``; the score that must reach ``THRESHOLD`` is
killed / (mutants - listed equivalents that survive). Exit status 1 when a core misses it.

    python tools/mutate.py                 # every core
    python tools/mutate.py journal text    # some cores
    python tools/mutate.py --survivors journal   # also print each surviving mutant's diff
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "mutants"
EQUIVALENTS = ROOT / "tools" / "mutate_equivalents.md"
THRESHOLD = 0.95


def floors() -> tuple[str, ...]:
    """The project's packages: the import contract's root packages (pyproject.toml), read each run
    so a package added or a core moved between floors is copied and mutated without an edit here."""
    with (ROOT / "pyproject.toml").open("rb") as config:
        return tuple(tomllib.load(config)["tool"]["importlinter"]["root_packages"])


@dataclass(frozen=True)
class Core:
    name: str
    what: str
    modules: tuple[str, ...]  # mutated together: one concern that spans modules
    tests: tuple[str, ...]

    @property
    def shown(self) -> str:
        return ", ".join(self.modules)


CORES = (
    Core("bounds", "deadline arithmetic", ("calls/bounds.py",), ("tests/calls/test_bounds.py",)),
    Core("policy", "the turn policy", ("turns/policy.py",), ("tests/turns/test_policy.py",)),
    Core(
        "classify",
        "classification (with the overflow table and the scope wordings)",
        ("calls/classify.py",),
        (
            "tests/calls/test_classify.py",
            "tests/calls/test_overflow_table.py",
            "tests/calls/test_limits.py",
        ),
    ),
    Core(
        "journal",
        "the journal's reduction",
        ("waits/core.py",),
        ("tests/waits/test_core.py", "tests/waits/test_core_scoped.py"),
    ),
    Core(
        "entries",
        "the journal's rows read back",
        ("waits/entries.py",),
        ("tests/waits/test_core.py", "tests/waits/test_core_scoped.py"),
    ),
    Core(
        "breaker",
        "the breaker's decision",
        ("breaker/decision.py",),
        ("tests/breaker/test_decision.py",),
    ),
    Core(
        "webhook-retry",
        "webhook retry",
        ("agentops/webhooks/retry.py",),
        ("tests/agentops/webhooks/test_retry.py",),
    ),
    Core("text", "text bounding", ("agentops/text.py",), ("tests/agentops/test_text.py",)),
    Core(
        "routing",
        "the routing choice (targets, the down rule, the pool's rotation)",
        ("turns/routing.py",),
        ("tests/turns/test_routing.py",),
    ),
    Core(
        "budget",
        "the budget arithmetic and the reservation estimate",
        ("agentops/budget_core.py",),
        ("tests/agentops/test_budget_core.py",),
    ),
    Core(
        "context",
        "the context estimate (the token count and its calibration) and the trim's selection",
        ("agentops/estimate.py", "turns/context/estimate.py", "turns/context/selection.py"),
        ("tests/turns/test_context_selection.py",),
    ),
)

# mutmut's exit codes per mutant (mutmut/stats.py): what counts as a kill.
KILLED = {
    1,
    3,
    36,
    37,
    -24,
    24,
    152,
    255,
    -11,
    -9,
}  # failed, pytest error, timeouts, type check, crash
SURVIVED = {0}
NO_TESTS = {5, 33}


@dataclass(frozen=True)
class Score:
    core: Core
    total: int
    killed: int
    survivors: tuple[str, ...]  # survived, no tests, suspicious, not checked
    equivalent: tuple[str, ...]  # survivors listed as equivalent
    stale: tuple[str, ...]  # listed as equivalent but killed or gone
    seconds: float

    @property
    def changing(self) -> int:
        """Mutants that change behaviour: all but the listed equivalents that survive."""
        return self.total - len(self.equivalent)

    @property
    def raw(self) -> float:
        return self.killed / self.total if self.total else 1.0

    @property
    def rate(self) -> float:
        return self.killed / self.changing if self.changing else 1.0


def natural(name: str) -> tuple[str, int]:
    """``x_f__mutmut_9`` before ``x_f__mutmut_10``."""
    head, _, number = name.rpartition("_")
    return (head, int(number)) if number.isdigit() else (name, 0)


def listed_equivalents() -> set[str]:
    """Mutant names in backquotes in the equivalents file (``waits.core.x_name__mutmut_3``)."""
    if not EQUIVALENTS.exists():
        return set()
    return set(re.findall(r"`([^`\s]+__mutmut_\d+)`", EQUIVALENTS.read_text()))


def stage(core: Core) -> Path:
    """A fresh scratch directory for ``core``: links to the tree and its own mutmut config."""
    here = WORK / core.name
    if here.exists():
        shutil.rmtree(here)
    here.mkdir(parents=True)
    # mutmut copies every source path into mutants/ and puts that first on sys.path. A package
    # left out would be imported from the real tree (the editable install) beside the copies of
    # the others, and a core in it would never run mutated: "0 files mutated".
    packages = floors()
    for module in core.modules:
        if module.split("/", 1)[0] not in packages:
            raise SystemExit(f"{module} is in no package of the import contract: {packages}")
    for name in (*packages, "tests"):
        (here / name).symlink_to(ROOT / name, target_is_directory=True)
    config = {
        "source_paths": list(packages),
        "only_mutate": list(core.modules),
        "pytest_add_cli_args_test_selection": list(core.tests),
        "use_git_change_detection": False,
        # pytest-django would put the directory of the nearest manage.py (the real tree) on
        # sys.path, and Django's app loading would then import the unmutated modules.
        "pytest_add_cli_args": ["-o", "django_find_project=false"],
    }
    section = "\n".join(f"{key} = {json.dumps(value)}" for key, value in config.items())
    (here / "pyproject.toml").write_text(
        (ROOT / "pyproject.toml").read_text() + f"\n[tool.mutmut]\n{section}\n"
    )
    return here


def own_database(env: dict[str, str]) -> dict[str, str]:
    """The environment with a database of mutation testing's own. pytest-django creates and drops
    ``test_<name>`` in each mutant's run; sharing the name with a ``make test`` running beside it
    would drop one's database under the other, and the failures would count as kills."""
    url = env.get("DATABASE_URL")
    if not url:
        return env
    parts = urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'agentops'}_mutmut"
    # Django connects to the database it is given, too, not only to the test database.
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return {**env, "DATABASE_URL": urlunsplit(parts._replace(path=f"/{name}"))}


def run(
    core: Core, *, env: dict[str, str], equivalents: set[str], survivors_diff: bool
) -> Score | None:
    here = stage(core)
    mutmut = Path(sys.executable).parent / "mutmut"
    log = here / "mutmut.log"
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.call(
            ["nice", "-n", "10", str(mutmut), "run", "--max-children", "1"],
            cwd=here,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    seconds = time.monotonic() - started
    metas = [here / "mutants" / (module + ".meta") for module in core.modules]
    if code != 0 or not all(meta.exists() for meta in metas):
        print(
            f"mutmut failed on {core.shown} (exit {code}); its output is in {log.relative_to(ROOT)}"
        )
        return None
    codes: dict[str, int | None] = {}
    for meta in metas:
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    killed = sum(1 for c in codes.values() if c in KILLED)
    survivors = tuple(sorted((name for name, c in codes.items() if c not in KILLED), key=natural))
    prefixes = tuple(m.removesuffix(".py").replace("/", ".") + "." for m in core.modules)
    mine = {name for name in equivalents if name.startswith(prefixes)}
    score = Score(
        core=core,
        total=len(codes),
        killed=killed,
        survivors=survivors,
        equivalent=tuple(name for name in survivors if name in mine),
        stale=tuple(sorted(mine - set(survivors), key=natural)),
        seconds=seconds,
    )
    if survivors_diff:
        for name in survivors:
            if name in mine:
                continue
            shown = subprocess.run(
                [str(mutmut), "show", name], cwd=here, capture_output=True, text=True
            )
            print(shown.stdout.rstrip() or f"# {name}: {codes[name]}", flush=True)
            print(flush=True)
    return score


def table(scores: list[Score]) -> str:
    head = (
        "core",
        "module",
        "mutants",
        "killed",
        "left",
        "equivalent",
        "raw",
        "changing behaviour",
        "time",
    )
    rows = [
        (
            s.core.name,
            s.core.shown,
            str(s.total),
            str(s.killed),
            str(len(s.survivors)),
            str(len(s.equivalent)),
            f"{s.raw:.1%}",
            f"{s.rate:.1%}" + ("" if s.rate >= THRESHOLD else f"  < {THRESHOLD:.0%}"),
            f"{s.seconds:.0f} s",
        )
        for s in scores
    ]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [head, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "cores", nargs="*", help=f"cores to run (default: all): {', '.join(c.name for c in CORES)}"
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="print the diff of each survivor not listed as equivalent",
    )
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CORES}
    unknown = [name for name in args.cores if name not in by_name]
    if unknown:
        parser.error(f"unknown cores: {', '.join(unknown)}")
    chosen = [by_name[name] for name in args.cores] if args.cores else list(CORES)
    equivalents = listed_equivalents()
    env = own_database({**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    scores, failed = [], []
    for core in chosen:
        print(
            f"mutating {core.shown} ({core.what}) against {', '.join(core.tests)} ...", flush=True
        )
        score = run(core, env=env, equivalents=equivalents, survivors_diff=args.survivors)
        if score is None:
            failed.append(core.name)
        else:
            scores.append(score)
    print()
    print(table(scores))
    for s in scores:
        if s.stale:
            print(
                f"\n{s.core.name}: listed as equivalent but not surviving "
                f"(update {EQUIVALENTS.relative_to(ROOT)}):"
            )
            print("\n".join(f"  {name}" for name in s.stale))
        left = [name for name in s.survivors if name not in s.equivalent]
        if left:
            print(f"\n{s.core.name}: {len(left)} survivors not listed as equivalent:")
            print("\n".join(f"  {name}" for name in left))
    if failed:
        print(f"\nmutmut could not run: {', '.join(failed)}")
    return 0 if not failed and all(s.rate >= THRESHOLD for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
