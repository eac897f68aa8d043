"""Run the README's quick start as a newcomer would (a CI step of .ci/run, issue 26).

``python -m docs.run_quickstart [--checkout DIR] [--timeout SECONDS]`` takes the README's one block
marked ``<!-- quickstart -->`` (see :mod:`docs.fenced_blocks`) and runs it with ``bash`` under
``set -e`` in a fresh temporary directory, with its ``git clone URL`` replaced by a clone of the
checkout (CI has no internet, and what is tested is this commit): the URL becomes the checkout's
path, and the directory the clone gets keeps the name the URL would give it, so the block's
``cd construct-mcp`` still works. The environment is a reader's: no provider API key, no
``CONSTRUCT_*`` setting but a fresh ``CONSTRUCT_HOME``. Output streams as it runs.

Exit status: the block's (0: it worked); 1 when the README has no quickstart block, several, or one
without a ``git clone`` line; 124 when it ran out of time.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from docs.fenced_blocks import quickstart_blocks
from orchestration.workers import KEY_VARIABLES

ROOT = Path(__file__).resolve().parents[1]
#: The provider keys a reader may have set, which the examples must neither need nor spend.
API_KEYS = frozenset(KEY_VARIABLES.values())
EXIT_NOT_RUN = 1
EXIT_TIMEOUT = 124

_CLONE = re.compile(
    r"(?P<head>\bgit\s+clone\s+(?:\S+\s+)*?)(?P<url>(?:[a-z+]+://|git@)\S+?)(?P<tail>(?:\s.*)?)$"
)
_END_OF_COMMAND = ("&&", "||", ";", "|", "#", ")")


class QuickstartError(Exception):
    """The README's quick start cannot be run (no block, several, no clone line)."""


def clone_directory(url: str) -> str:
    """The directory ``git clone URL`` makes: the URL's last part without ``.git``."""
    name = re.split(r"[/:]", url.rstrip("/"))[-1]
    return name.removesuffix(".git")


def with_local_clone(script: str, checkout: Path) -> str:
    """``script`` with every ``git clone URL [DIR]`` cloning ``checkout`` instead, into the
    directory the URL would have given (or ``DIR``). Raises QuickstartError when it clones nothing."""
    out: list[str] = []
    replaced = 0
    for line in script.splitlines():
        found = _CLONE.search(line)
        if found is not None:
            tail = found.group("tail")
            given_dir = tail.strip() and not tail.strip().startswith(_END_OF_COMMAND)
            target = "" if given_dir else f" {clone_directory(found.group('url'))}"
            line = f"{line[: found.start()]}{found.group('head')}{shlex.quote(str(checkout))}{target}{tail}"
            replaced += 1
        out.append(line)
    if not replaced:
        raise QuickstartError("the README's <!-- quickstart --> block has no `git clone URL` line")
    return "\n".join(out) + "\n"


def quickstart_script(root: Path, checkout: Path) -> str:
    """The bash script CI runs: ``set -e``, then the README's quickstart block with a local clone.
    Raises QuickstartError when the README has no such block, or several."""
    found = quickstart_blocks(root)
    if not found:
        raise QuickstartError("no <!-- quickstart --> block in README.md")
    if len(found) > 1:
        raise QuickstartError(
            "README.md has several <!-- quickstart --> blocks: " + ", ".join(b.where for b in found)
        )
    return "set -e\n" + with_local_clone(found[0].text, checkout)


def reader_environment(environ: Mapping[str, str], construct_home: Path) -> dict[str, str]:
    """``environ`` as a newcomer has it: no provider API key, no ``CONSTRUCT_*`` or ``OTEL_*``
    variable, ``CONSTRUCT_HOME`` a directory of its own (fresh)."""
    env = {
        k: v for k, v in environ.items() if k not in API_KEYS and not k.startswith(("CONSTRUCT_", "OTEL_"))
    }
    env["CONSTRUCT_HOME"] = str(construct_home)
    return env


def run(root: Path, checkout: Path, timeout: float) -> int:
    """Run the quick start (see the module docstring); return its exit status."""
    script = quickstart_script(root, checkout)
    with tempfile.TemporaryDirectory(prefix="construct-quickstart-") as scratch:
        work = Path(scratch) / "newcomer"
        work.mkdir()
        (Path(scratch) / "quickstart.sh").write_text(script, "utf-8")
        print(f"quickstart: running in {work}:\n{script}", file=sys.stderr, flush=True)
        env = reader_environment(os.environ, Path(scratch) / "construct-home")
        process = subprocess.Popen(
            ["bash", str(Path(scratch) / "quickstart.sh")],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            print(f"quickstart: still running after {timeout:.0f} s: stopped", file=sys.stderr)
            return EXIT_TIMEOUT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.run_quickstart", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--checkout", type=Path, default=ROOT, help="the repository to clone (default: this one)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the block may take")
    args = parser.parse_args(argv)
    try:
        status = run(args.checkout.resolve(), args.checkout.resolve(), args.timeout)
    except QuickstartError as exc:
        print(f"quickstart: {exc}", file=sys.stderr)
        return EXIT_NOT_RUN
    print(f"quickstart: exit status {status}", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
