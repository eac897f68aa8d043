"""Write ``docs/reliability.md``: what the reliability tests tried, how many times, and what held.

The acceptance tests that break things on purpose — the kill matrix, the races, graceful shutdown,
corrupt records, scale-out and the Postgres restart — wrap each attempt in
:func:`tests.acceptance.reliability.trial`, which writes one JSON record per attempt into the
directory named by ``CONSTRUCT_RELIABILITY_OUT``. This script runs those tests with that variable
set (and a JUnit XML report next to the records), then renders the records as Markdown::

    CONSTRUCT_TEST_POSTGRES_DSN=postgresql://postgres@127.0.0.1:5432/test \\
        python bench/reliability_report.py [--out docs/reliability.md] [--results DIR] [--no-run]
                                           [--tests FILE ...]

``--results DIR`` keeps the records in DIR (default: a temporary directory); with ``--no-run`` the
tests are not run and DIR's records are rendered as they are. Without a reachable PostgreSQL the
postgres cases skip, and the report says so.

Exit status: that of the test run (0 when every test passed), so a CI job can publish the report
and still fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(REPO))

from stores import redact_url  # noqa: E402
from tests.acceptance.reliability import OUT_ENV, load_records  # noqa: E402

DSN_ENV = "CONSTRUCT_TEST_POSTGRES_DSN"
JUNIT = "junit.xml"
#: When and on which commit the records were made (JSON; not a record, hence not *.json).
RUN_INFO = "run-info.txt"

DEFAULT_TESTS = (
    "tests/acceptance/test_kill_matrix.py",
    "tests/acceptance/test_races.py",
    "tests/acceptance/test_shutdown.py",
    "tests/acceptance/test_corrupt_records.py",
    "tests/acceptance/test_scale_out.py",
    "tests/acceptance/test_postgres_restart.py",
)


@dataclass(frozen=True)
class Category:
    title: str
    tried: str
    held: str
    source: str


#: What each category of trial is, in the order the report shows them. A category not listed here
#: (a new test) is still reported, under its own name.
CATEGORIES: dict[str, Category] = {
    "kill_after_write": Category(
        "SIGKILL after each durable write",
        "A gated provider chain (architect, an approval gate, engineer, reviewer: 10 facts in 9 durable "
        "writes) runs on a server started with `CONSTRUCT_FAULT_CRASH_AFTER_WRITES=N`, which SIGKILLs itself "
        "right after its N-th write; a second server is started on the same store and the host repeats "
        "its idempotent calls (start with the same idempotency key, approve, wait).",
        "The run ended exactly as the uninterrupted run: same status, outputs and decisions, the same "
        "facts in the same order except one orphaned attempt when the kill followed an "
        "`attempt_started`; one run in the store; the fake provider called once per task; the retried "
        "attempt marked `possible_duplicate_call`.",
        "tests/acceptance/test_kill_matrix.py",
    ),
    "random_kill": Category(
        "SIGKILL from outside during a provider call",
        "The same chain; the test SIGKILLs the server (pid file) a seeded random delay after the fake "
        "provider received the call it holds open, then restarts it on the same store.",
        "As above, and the interrupted task was called exactly twice (every other task once), its "
        "second attempt marked `possible_duplicate_call`.",
        "tests/acceptance/test_kill_matrix.py",
    ),
    "race": Category(
        "Racing callers",
        "20 MCP clients over 2 Streamable HTTP servers on one store fire `orchestrate_resume` (same "
        "and different outputs), `orchestrate_approve` (approve and reject) and `orchestrate_cancel` "
        "at the same runs at once, released by one barrier; 4 runs per round.",
        "Every caller got a run view or an error starting with a stable code (`conflict`, "
        "`invalid_state`; never `version_conflict`); exactly one request made each transition and "
        "the callers who asked for the same thing got the current state, the others `conflict`; no "
        "task completed or prepared twice; sequence numbers contiguous, no transition recorded "
        "twice; the head equals the fold of the facts.",
        "tests/acceptance/test_races.py",
    ),
    "provider_race": Category(
        "Two servers racing for provider runs",
        "8 provider runs are approved through both servers at once, so both dispatchers go for "
        "every run; 2 of them are cancelled through both servers while their call is in flight.",
        "Each task of each run called exactly once; the cancelled runs end with the cancel, nothing "
        "recorded after it.",
        "tests/acceptance/test_races.py",
    ),
    "shutdown": Category(
        "Graceful shutdown",
        "A server is stopped (SIGTERM, or the end of stdin as the MCP SDK's client does it) while "
        "the fake provider holds one of its calls (`long`: the call outlasts the 1 s grace period; "
        "`short`: it ends within it; `none`: an idle server), with a client waiting on a call. "
        "`exit_seconds`: from the signal (or stdin closing) to the process being gone; "
        "`takeover_seconds`: a second server, started afterwards, finishing the run (its own "
        "start-up included).",
        "It stopped taking work (after a `short` call its result was recorded and the next task not "
        "started), the write in progress finished (the head equals the fold of the facts), the "
        "run's lease was released (a probe claims it at once; the second server, with a 30 s lease "
        "TTL, finished the run within seconds, a `long` call retried and marked "
        "`possible_duplicate_call`), and it exited within the bound (15 s; the end of stdin also "
        "before the SDK's SIGTERM at 2 s).",
        "tests/acceptance/test_shutdown.py",
    ),
    "corrupt_records": Category(
        "Corrupt records at the server",
        "While no server runs, two runs' `head.json` (cut short, garbage) and two runs' "
        "`facts.jsonl` tails (cut short, garbage) are damaged on a filesystem store; a server then "
        "starts on it.",
        "The server did not crash; `run_status` on a damaged run answers `corrupt_record: run <id>: "
        "<file> cannot be read: ...`; other runs (old and new) work; the dispatcher reports each "
        "damaged run a bounded number of times instead of at every poll.",
        "tests/acceptance/test_corrupt_records.py",
    ),
    "scale_out": Category(
        "Scale-out",
        "Several servers on one store execute runs together.",
        "Every run completed and each task was called once.",
        "tests/acceptance/test_scale_out.py",
    ),
    "scale_out_kill": Category(
        "Scale-out with a killed server",
        "One of the servers sharing a Postgres database is SIGKILLed mid-way.",
        "The others finished its runs after their leases expired; only calls in flight at the kill "
        "were repeated, and marked.",
        "tests/acceptance/test_scale_out.py",
    ),
    "notify_wakeup": Category(
        "LISTEN/NOTIFY wake-up",
        "An approval given to one server wakes the run on another (whose poll interval is long).",
        "The run was picked up without waiting for a poll (latencies shown).",
        "tests/acceptance/test_scale_out.py",
    ),
    "postgres_restart": Category(
        "PostgreSQL restarted mid-run",
        "The database cluster is restarted while runs are in progress.",
        "No fact lost or written twice; every run completed.",
        "tests/acceptance/test_postgres_restart.py",
    ),
    "postgres_down": Category(
        "PostgreSQL down past the outage deadline",
        "The database stays down longer than the configured outage deadline.",
        "In-flight work stopped cleanly and resumed once the database was back.",
        "tests/acceptance/test_postgres_restart.py",
    ),
}

STORE_ORDER = ("filesystem", "sqlite", "postgres")

#: Said in every report, so that nobody reads more into the figures than they carry.
LIMITS = (
    "Kills are SIGKILLs of server processes, not power losses: the operating system's page cache "
    "survives them. Durability across a machine crash rests on the stores' fsync / commit (the "
    "filesystem store fsyncs facts, index, head and directories), which these tests do not cut.",
    "Everything runs on one machine; the model provider is the fake one (real HTTP, scripted "
    "answers and delays), so provider latencies and failures are the scripted ones.",
    "Corrupt files are tested on the filesystem store only; on SQLite and PostgreSQL a damaged "
    "database is the database's own integrity problem.",
    "Trial durations include starting the server processes (about 2 s each) and depend on the "
    "machine's load.",
)


# ------------------------------------------------------------------------------------------------
# Running the tests


async def run_tests(results: Path, tests: Sequence[str], extra: Sequence[str]) -> int:
    env = {**os.environ, OUT_ENV: str(results)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={results / JUNIT}",
        *tests,
        *extra,
    ]
    print("running:", " ".join(command[1:]), file=sys.stderr)
    process = await asyncio.create_subprocess_exec(*command, cwd=REPO, env=env)
    return await process.wait()


async def postgres_version() -> str | None:
    dsn = os.environ.get(DSN_ENV, "").strip()
    if not dsn:
        return None
    try:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(dsn, timeout=5)
    except Exception as exc:
        return f"unreachable ({type(exc).__name__})"
    try:
        version: str = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return f"PostgreSQL {version} at {redact_url(dsn)}"


async def git_commit() -> str:
    process = await asyncio.create_subprocess_exec(
        "git", "describe", "--always", "--dirty", cwd=REPO, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    return out.decode().strip() or "unknown"


# ------------------------------------------------------------------------------------------------
# Rendering


@dataclass(frozen=True)
class JUnitSummary:
    tests: int
    failures: int
    errors: int
    skipped: int
    seconds: float
    skip_reasons: dict[str, int]
    failed: list[str]


def read_junit(path: Path) -> JUnitSummary | None:
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = Counter[str]()
    seconds = 0.0
    reasons: Counter[str] = Counter()
    failed: list[str] = []
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            total[key] += int(suite.get(key, 0))
        seconds += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            skipped = case.find("skipped")
            if skipped is not None:
                reasons[(skipped.get("message") or "skipped").strip()[:160]] += 1
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(name)
    return JUnitSummary(
        total["tests"],
        total["failures"],
        total["errors"],
        total["skipped"],
        seconds,
        dict(reasons),
        failed,
    )


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_cell(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return "" if value is None else str(value).replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _store_key(store: Any) -> int:
    return STORE_ORDER.index(store) if store in STORE_ORDER else len(STORE_ORDER)


def _stores(records: list[dict[str, Any]]) -> str:
    found = {r["params"].get("store") for r in records} - {None}
    return ", ".join(sorted(found, key=_store_key)) or "-"


def _held(records: list[dict[str, Any]]) -> str:
    held = sum(r["held"] for r in records)
    return f"{held} / {len(records)}" if held == len(records) else f"**{held} / {len(records)}**"


def _kill_matrix(records: list[dict[str, Any]]) -> list[str]:
    stores = sorted({r["params"]["store"] for r in records}, key=_store_key)
    by_position: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    writes: dict[int, str] = {}
    for r in records:
        position = int(r["params"]["position"])
        by_position[position][r["params"]["store"]] = r
        task = r["params"].get("task")
        writes[position] = r["params"]["write"] + (f" ({task})" if task else "")
    rows = []
    for position in sorted(by_position):
        cells = []
        for store in stores:
            found = by_position[position].get(store)
            cells.append("-" if found is None else ("held" if found["held"] else "**FAILED**"))
        rows.append([position, writes[position], *cells])
    return _table(["killed after write", "that write", *stores], rows)


def _generic(records: list[dict[str, Any]]) -> list[str]:
    params = sorted({k for r in records for k in r["params"]} - {"store"})
    notes = sorted({k for r in records for k in r["notes"]})
    header = ["store", *params, *notes, "held", "seconds"]
    rows = []
    for r in sorted(records, key=lambda r: (_store_key(r["params"].get("store")), str(r["params"]))):
        held = "held" if r["held"] else f"**FAILED**: {r['error']}"
        rows.append(
            [
                r["params"].get("store", "-"),
                *[r["params"].get(k) for k in params],
                *[r["notes"].get(k) for k in notes],
                held,
                r["seconds"],
            ]
        )
    return _table(header, rows)


def _counts(by_category: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The headline counts: kills, restarts, racing calls, damaged files, shutdowns."""

    def total(category: str, key: str) -> int:
        return sum(int(r["notes"].get(key, r["params"].get(key, 0)) or 0) for r in by_category[category])

    fault, outside = len(by_category["kill_after_write"]), len(by_category["random_kill"])
    parts = []
    if fault or outside:
        restarts = total("kill_after_write", "restarts") + total("random_kill", "restarts")
        parts.append(
            f"{fault + outside} server processes SIGKILLed ({fault} by fault injection after a chosen "
            f"write, {outside} from outside during a provider call) and {restarts} restarts on the "
            "same store"
        )
    if by_category["race"]:
        parts.append(
            f"{total('race', 'racing_calls')} racing tool calls from "
            f"{max(int(r['params'].get('clients', 0)) for r in by_category['race'])} clients over "
            f"{max(int(r['params'].get('servers', 0)) for r in by_category['race'])} servers"
        )
    if by_category["provider_race"]:
        parts.append(f"{total('provider_race', 'runs')} provider runs raced for by two servers")
    if by_category["corrupt_records"]:
        parts.append(f"{total('corrupt_records', 'damaged')} damaged run files")
    if by_category["shutdown"]:
        parts.append(f"{len(by_category['shutdown'])} shutdowns with work in progress or idle")
    if by_category["postgres_restart"] or by_category["postgres_down"]:
        parts.append(
            f"{len(by_category['postgres_restart']) + len(by_category['postgres_down'])} PostgreSQL "
            "restarts or outages"
        )
    return parts


def render(
    records: list[dict[str, Any]],
    junit: JUnitSummary | None,
    *,
    generated: datetime,
    commit: str,
    postgres: str | None,
    tests: Sequence[str],
) -> str:
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_category[r["category"]].append(r)
    order = [c for c in CATEGORIES if c in by_category] + sorted(set(by_category) - set(CATEGORIES))

    out = [
        "# Reliability report",
        "",
        "What construct-mcp's reliability tests tried against real server processes — kills, races, "
        "restarts, shutdowns, corrupt files — how many times, on which stores, and what held. "
        "Generated from the test runs by `bench/reliability_report.py`; do not edit by hand.",
        "",
        f"- generated: {generated:%Y-%m-%d %H:%M} UTC, commit `{commit}`",
        f"- machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        f"- PostgreSQL: {postgres or f'not configured ({DSN_ENV} unset): postgres cases skipped'}",
    ]
    if junit is not None:
        out.append(
            f"- pytest: {junit.tests} tests, {junit.tests - junit.failures - junit.errors - junit.skipped} "
            f"passed, {junit.failures + junit.errors} failed, {junit.skipped} skipped, "
            f"{junit.seconds / 60:.1f} min"
        )
    out += [
        "",
        "Reproduce (the report) and run one part on its own:",
        "",
        "```sh",
        f"{DSN_ENV}=postgresql://postgres@127.0.0.1:5432/test python bench/reliability_report.py",
        *[f"pytest {t}" for t in tests],
        "```",
        "",
        "## Summary",
        "",
    ]
    summary = []
    for name in order:
        group = by_category[name]
        title = CATEGORIES[name].title if name in CATEGORIES else name
        summary.append(
            [title, _stores(group), len(group), _held(group), f"{sum(r['seconds'] for r in group):.0f}"]
        )
    out += _table(["what was tried", "stores", "trials", "held", "seconds"], summary)
    totals = Counter(r["params"].get("store", "-") for r in records)
    out += [
        "",
        f"{len(records)} trials in all ("
        + ", ".join(f"{n} on {s}" for s, n in sorted(totals.items(), key=lambda kv: _store_key(kv[0])))
        + f"); {sum(not r['held'] for r in records)} did not hold.",
    ]
    counts = _counts(by_category)
    if counts:
        out += ["", "In numbers: " + "; ".join(counts) + "."]
    if junit is not None and junit.skip_reasons:
        out += ["", "Skipped tests:", ""]
        out += [f"- {n} x {reason}" for reason, n in sorted(junit.skip_reasons.items())]
    if junit is not None and junit.failed:
        out += ["", "Failed tests:", ""] + [f"- `{name}`" for name in junit.failed]

    for name in order:
        group = by_category[name]
        info = CATEGORIES.get(name)
        out += ["", f"## {info.title if info else name}", ""]
        if info is not None:
            out += [
                f"**Tried.** {info.tried}",
                "",
                f"**Held when.** {info.held}",
                "",
                f"Source: `{info.source}`.",
                "",
            ]
        out += _kill_matrix(group) if name == "kill_after_write" else _generic(group)
    out += ["", "## What these figures do not show", ""]
    out += [f"- {line}" for line in LIMITS]
    failures = [r for r in records if not r["held"]]
    if failures:
        out += ["", "## What did not hold", ""]
        out += [f"- {r['category']} {_cell(r['params'])}: {r['error']} (`{r['test']}`)" for r in failures]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    parser.add_argument("--results", type=Path, help="keep the records here (default: a temp dir)")
    parser.add_argument("--no-run", action="store_true", help="render --results without running tests")
    parser.add_argument("--tests", nargs="+", default=list(DEFAULT_TESTS), help="test files to run")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    if args.no_run and args.results is None:
        parser.error("--no-run needs --results DIR")
    tests = [t for t in args.tests if (REPO / t).exists()]
    status = 0
    with tempfile.TemporaryDirectory(prefix="construct-reliability-") as tmp:
        results = args.results or Path(tmp)
        if not args.no_run:
            results.mkdir(parents=True, exist_ok=True)
            for old in [*results.glob("*.json"), results / JUNIT, results / RUN_INFO]:
                old.unlink(missing_ok=True)
            # What the records were made with, kept for a later --no-run rendering.
            info: dict[str, str | None] = {
                "started": datetime.now(UTC).isoformat(),
                "commit": await git_commit(),
            }
            status = await run_tests(results.resolve(), tests, args.pytest_args)
            info["postgres"] = await postgres_version()
            (results / RUN_INFO).write_text(json.dumps(info), encoding="utf-8")
        records = load_records(results)
        if not records:
            print(f"no records in {results}", file=sys.stderr)
            return status or 1
        try:
            info = json.loads((results / RUN_INFO).read_text(encoding="utf-8"))
        except FileNotFoundError:
            info = {"started": datetime.now(UTC).isoformat(), "commit": await git_commit()}
            info["postgres"] = await postgres_version()
        text = render(
            records,
            read_junit(results / JUNIT),
            generated=datetime.fromisoformat(str(info["started"])),
            commit=str(info["commit"]),
            postgres=info.get("postgres"),
            tests=tests,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(records)} trials)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
