"""What every bench shares: timing, alternation, the targets ``--check`` holds figures to, and how
they print. A bench measures its own scenario and prints its own figures; it times calls with
:func:`once` and :func:`repeat`, runs two variants interleaved with :func:`alternate`, and ends with
:func:`conclude`, which prints one line per target and gives the exit status.

Every target prints the same way, whether ``--check`` is given or not::

    targets:
      [        met] postgres: step 50 at most 1.3 x step 5: 0.98 x
      [     MISSED] sqlite: at most 1.5 ms: 1.62 ms
      [not checked] postgres targets: no Postgres

and with ``--check`` one more line says what it decided: ``--check: 1 target(s) missed`` (exit 1),
or ``--check: every target met`` (exit 0). A target whose figures were not measured (no Postgres,
an optional extra missing) is not checked, and is not a miss: ``--check: no target missed (1 not
checked)`` (exit 0).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# ------------------------------------------------------------------------------------------ figures


def median(values: Sequence[float]) -> float:
    """The median; NaN for no values (a figure that was not measured)."""
    return statistics.median(values) if values else float("nan")


def p90(values: Sequence[float]) -> float:
    """The 90th percentile (``statistics.quantiles``, exclusive); NaN for fewer than two values."""
    return statistics.quantiles(values, n=10)[8] if len(values) >= 2 else float("nan")


def ms(seconds: float) -> str:
    """Seconds as milliseconds, two decimals: ``0.00123`` -> ``"1.23 ms"``."""
    return f"{seconds * 1000:.2f} ms"


# ------------------------------------------------------------------------------------------- timing


async def once(call: Callable[[], Awaitable[object]], *, quiet_gc: bool = False) -> float:
    """Seconds one awaited ``call()`` takes (``time.perf_counter``). With ``quiet_gc``, as timeit
    does: a collection first and none during the call, so that a bench whose heap holds much of
    its own set-up does not time collecting it."""
    if quiet_gc:
        gc.collect()
        gc.disable()
    try:
        started = time.perf_counter()
        await call()
        return time.perf_counter() - started
    finally:
        if quiet_gc:
            gc.enable()


async def repeat(
    call: Callable[[], Awaitable[T]],
    times: int,
    *,
    warmup: int = 0,
    after: Callable[[T], Awaitable[None]] | None = None,
) -> list[float]:
    """Seconds of ``times`` calls of ``call()``, after ``warmup`` untimed ones (a first call that
    fills caches or prepares statements); each call is followed by ``after(its result)``, untimed."""
    seconds: list[float] = []
    for n in range(warmup + times):
        started = time.perf_counter()
        result = await call()
        if n >= warmup:
            seconds.append(time.perf_counter() - started)
        if after is not None:
            await after(result)
    return seconds


async def alternate(variants: Mapping[str, Callable[[], Awaitable[T]]], rounds: int) -> dict[str, list[T]]:
    """Each variant's results over ``rounds`` rounds, the variants interleaved (A, B, A, B, ... in
    the order given): a machine's load weighs on every variant alike, so that their ratio is one of
    the same moment. A variant measures itself and returns what it measured."""
    results: dict[str, list[T]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, variant in variants.items():
            results[name].append(await variant())
    return results


# ------------------------------------------------------------------------------- processes (Linux)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, in seconds (``/proc``); OSError when the
    process is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """The resident set of process ``pid``, in KiB (``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# ------------------------------------------------------------------------------------------ targets


@dataclass(frozen=True)
class Check:
    """One target: what it holds, whether it held (None: its figures were not measured), and the
    figure it was held to."""

    what: str
    ok: bool | None
    detail: str


def check_line(check: Check) -> str:
    verdict = "not checked" if check.ok is None else ("met" if check.ok else "MISSED")
    return f"  [{verdict:>11}] {check.what}: {check.detail}"


def missed(checks: Sequence[Check]) -> list[Check]:
    """The checks that failed; a check not measured (``ok is None``) is not a miss."""
    return [c for c in checks if c.ok is False]


def conclude(
    checks: Sequence[Check],
    *,
    check: bool,
    counted: Sequence[Check] | None = None,
    scope: str = "",
    title: str = "targets",
) -> int:
    """Print every target under ``title``, and with ``check`` the verdict; the exit status: 1 when
    ``check`` and a target of ``counted`` (default: all of them) was missed, else 0. ``scope`` names
    what is counted when it is not everything (``"of the host path"``)."""
    print()
    print(f"{title}:")
    for c in checks:
        print(check_line(c))
    if not check:
        return 0
    held_to = checks if counted is None else counted
    failed = missed(held_to)
    unmeasured = sum(1 for c in held_to if c.ok is None)
    named = f" {scope}" if scope else ""
    if failed:
        print(f"--check: {len(failed)} target(s){named} missed")
        return 1
    if unmeasured:
        print(f"--check: no target{named} missed ({unmeasured} not checked)")
    else:
        print(f"--check: every target{named} met")
    return 0


# -------------------------------------------------------------------------------------- arguments


def parser(doc: str | None, *, check: str | None = None) -> argparse.ArgumentParser:
    """A bench's argument parser, its module docstring as its help; with ``check``, the ``--check``
    flag (``check`` says when it exits 1)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if check is not None:
        p.add_argument("--check", action="store_true", help=f"exit 1 when {check}")
    return p


def add_postgres_dsn(p: argparse.ArgumentParser) -> None:
    """``--postgres-dsn``, by default ``CONSTRUCT_TEST_POSTGRES_DSN`` (empty: no Postgres)."""
    p.add_argument("--postgres-dsn", default=os.environ.get("CONSTRUCT_TEST_POSTGRES_DSN", ""))


def names(option: str) -> list[str]:
    """A comma-separated option (``--stores memory,sqlite``) as its names, blanks dropped."""
    return [name.strip() for name in option.split(",") if name.strip()]
