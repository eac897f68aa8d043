"""How soon ``construct-mcp serve`` answers a host (not a test: run it and read the figures, or with
``--check`` as a guard before merging a change to what ``serve`` imports or does before it answers).

A host such as Codex CLI sends its first model request about a second after it spawns its MCP
servers, and starts without the tools of a server that has not answered ``initialize`` by then. The
bench spawns the venv's ``construct-mcp serve`` (stdio, a fresh temporary ``CONSTRUCT_HOME``, the
filesystem store) ``--spawns`` times, one after another, and on each:

* writes an ``initialize`` request (protocol version 2025-06-18, as the hosts send it) as raw JSON-RPC
  to its stdin at once, and measures the wall time from the spawn to the answer on its stdout;
* then sends ``notifications/initialized`` and ``tools/list``, and measures the time from the spawn
  to the ``tools/list`` answer;
* then sends ``ping``, which only the server itself answers, and measures the time from the spawn to
  that answer: when the server is serving;
* closes stdin and waits for the process to exit.

It prints the median, p90 and max of the three; what the process imports before it answers
``initialize`` and ``tools/list`` (``serve`` answers them before it imports the server, see
``server/transports/handshake.py``), with the imports that cost most there; and the imports that
cost most when ``server.cli.main`` and the stdio server are imported (``python -X importtime``,
cumulative), which is what stands between those answers and the server serving.

    python bench/startup.py [--spawns 10] [--check] [--top 8]

``--check`` exits 1 when the median time to the ``initialize`` answer exceeds
:data:`INITIALIZE_TARGET_SECONDS`.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Check, conclude, median, p90, parser

#: The median time from spawn to the ``initialize`` answer that ``--check`` holds ``serve`` to: a host
#: that waits about a second must have its answer with room to spare on a busy machine.
INITIALIZE_TARGET_SECONDS = 0.3
#: the protocol version the hosts (Codex CLI, Claude Desktop) send in ``initialize``
PROTOCOL_VERSION = "2025-06-18"
#: how long one spawn may take to answer before the bench gives up on it
ANSWER_TIMEOUT_SECONDS = 30.0
#: what ``-X importtime`` is asked to import: the CLI, then the stdio server ``serve`` builds
IMPORTS = "import server.cli.main, server.app"
#: what ``serve`` imports before it answers ``initialize``: the entry point, and what it needs to
#: build the answer (the package version through ``importlib.metadata``)
EARLY_IMPORTS = "import server.__main__; server.__main__.inline_card()"

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Spawn:
    """One spawn's figures, in seconds from the spawn."""

    initialize: float
    tools_list: float
    served: float
    tools: int


def _message(id_: int | None, method: str, params: dict[str, object] | None = None) -> bytes:
    body: dict[str, object] = {"jsonrpc": "2.0", "method": method}
    if id_ is not None:
        body["id"] = id_
    if params is not None:
        body["params"] = params
    return json.dumps(body).encode() + b"\n"


INITIALIZE = _message(
    1,
    "initialize",
    {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "bench-startup", "version": "0"},
    },
)
INITIALIZED = _message(None, "notifications/initialized")
TOOLS_LIST = _message(2, "tools/list", {})
PING = _message(3, "ping")


class _Lines:
    """The JSON-RPC messages a process writes to its stdout, read as they arrive."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)

    def answer(self, id_: int, deadline: float) -> dict[str, object]:
        """The answer to request ``id_`` (other messages are skipped); raises at ``deadline``."""
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if isinstance(message, dict) and message.get("id") == id_:
                    if "error" in message:
                        raise RuntimeError(f"request {id_} failed: {message['error']}")
                    return message
            left = deadline - time.perf_counter()
            if left <= 0 or not self._selector.select(left):
                raise TimeoutError(f"no answer to request {id_}")
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise RuntimeError(f"the server exited before answering request {id_}")
            self._buffer += chunk

    def close(self) -> None:
        self._selector.close()


def _executable() -> str:
    """The venv's ``construct-mcp`` (beside this interpreter), as a host's config names it."""
    path = Path(sys.executable).parent / "construct-mcp"
    if not path.exists():
        raise SystemExit(f"no {path}: install the project in this interpreter's venv (pip install -e .)")
    return str(path)


def spawn_once(executable: str, home: Path) -> Spawn:
    """Spawn ``serve`` on a fresh home, hand it ``initialize`` at once and time the answers."""
    env = {**os.environ, "CONSTRUCT_HOME": str(home), "CONSTRUCT_ORCHESTRATION_STORE": "filesystem"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [executable, "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdin is not None
    lines = _Lines(proc)
    try:
        # A host writes initialize as soon as the pipe is there; the pipe holds it until it is read.
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        deadline = started + ANSWER_TIMEOUT_SECONDS
        lines.answer(1, deadline)
        initialized = time.perf_counter() - started
        proc.stdin.write(INITIALIZED + TOOLS_LIST)
        proc.stdin.flush()
        listed = lines.answer(2, deadline)
        tools_listed = time.perf_counter() - started
        proc.stdin.write(PING)
        proc.stdin.flush()
        lines.answer(3, deadline)
        served = time.perf_counter() - started
        result = listed.get("result")
        tools = result.get("tools", []) if isinstance(result, dict) else []
        return Spawn(initialized, tools_listed, served, len(tools) if isinstance(tools, list) else 0)
    finally:
        lines.close()
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def top_imports(count: int, imports: str = IMPORTS) -> list[tuple[float, str]]:
    """The ``count`` imports with the largest cumulative time (seconds, module) under ``imports``,
    from a fresh interpreter with ``-X importtime``; one module is shown once, at its outermost
    import, with the modules it imported on its behalf left out (they are in its figure)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", imports],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    rows: list[tuple[float, int, str]] = []
    for line in run.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append((int(cumulative) / 1e6, depth, name.strip()))
    # importtime lists a module after what it imported: a row's children are the deeper rows just
    # above it. Keep the rows whose parent is the top level or a first-party package.
    top: list[tuple[float, str]] = []
    first_party = ("server", "orchestration", "stores")
    stack: list[tuple[int, str]] = []  # (depth, name) of rows read so far, to find parents
    for seconds, depth, name in reversed(rows):
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents = [n for _, n in stack]
        if all(p.split(".")[0] in first_party for p in parents) and name.split(".")[0] not in first_party:
            top.append((seconds, name))
        stack.append((depth, name))
    top.sort(reverse=True)
    return top[:count]


def main() -> int:
    p = parser(__doc__, check="the target is missed")
    p.add_argument("--spawns", type=int, default=10, help="servers spawned, one after another")
    p.add_argument("--top", type=int, default=8, help="third-party imports listed")
    args = p.parse_args()

    executable = _executable()
    spawns: list[Spawn] = []
    with tempfile.TemporaryDirectory(prefix="construct-startup-") as tmp:
        for n in range(args.spawns):
            spawns.append(spawn_once(executable, Path(tmp) / f"home-{n}"))

    def row(label: str, values: list[float]) -> None:
        print(
            f"  {label:<34} median {median(values):.3f} s   p90 {p90(values):.3f} s   max {max(values):.3f} s"
        )

    print(f"construct-mcp serve (stdio, filesystem store, fresh home), {len(spawns)} spawns:")
    row("spawn -> initialize answered", [s.initialize for s in spawns])
    row("spawn -> tools/list answered", [s.tools_list for s in spawns])
    row("spawn -> ping answered (serving)", [s.served for s in spawns])
    print(f"  tools listed: {spawns[-1].tools}")

    early = top_imports(args.top, EARLY_IMPORTS)
    print(f"\nimported before the early answers (python -X importtime -c '{EARLY_IMPORTS}'):")
    for seconds, name in early:
        print(f"  {seconds:.3f} s  {name}")
    print(f"\nthird-party imports that cost most (python -X importtime -c '{IMPORTS}'):")
    for seconds, name in top_imports(args.top):
        print(f"  {seconds:.3f} s  {name}")

    initialize = median([s.initialize for s in spawns])
    target = Check(
        f"initialize answered within {INITIALIZE_TARGET_SECONDS:g} s (median)",
        initialize <= INITIALIZE_TARGET_SECONDS,
        f"{initialize:.3f} s",
    )
    return conclude([target], check=args.check)


if __name__ == "__main__":
    raise SystemExit(main())
