"""How often Codex CLI's first model request already lists construct's tools when the server is
configured WITHOUT ``required = true``.

Codex sends its first model request about 1 s after spawning its MCP servers and, without
``required = true``, does not wait for them: a server that starts slower than that is missing from
the first request's tools. This starts ``codex exec`` ``--runs`` times (default 10) against the
scripted model of ``tests/hosts`` with docs/hosts.md's Codex block minus ``required = true``, and
counts the runs whose first ``/v1/responses`` request lists a ``mcp__construct`` tool.

    .venv/bin/python -m bench.host_tools_ready            # prints "ready in N of 10 runs"
    .venv/bin/python -m bench.host_tools_ready --check    # exit 1 unless 10 of 10

Needs the host CLIs (``npm ci`` in tests/hosts).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench.harness import Check, conclude, parser
from tests.hosts import launch
from tests.hosts.scripted_model import ScriptedModel


def first_request_lists_tools(dump: Path) -> bool:
    """Whether the first Responses request dumped in ``dump`` lists a ``mcp__construct`` tool."""
    for path in sorted(dump.glob("*.json")):
        request = json.loads(path.read_text(encoding="utf-8"))
        if not str(request["path"]).endswith("/responses"):
            continue
        tools = request["body"].get("tools", [])
        return any("mcp__construct" in str(tool.get("name", "")) for tool in tools)
    return False


def one_run(root: Path) -> bool:
    dump = root / "dump"
    dump.mkdir(parents=True)
    home = root / "construct"
    home.mkdir()
    block = launch.doc_block("codex")
    assert "required = true" in block
    original = launch.doc_block
    launch.doc_block = lambda host: block.replace("required = true\n", "").replace("required = true", "")
    try:
        with ScriptedModel(dump_dir=dump) as model:
            launch.run_host("codex", model.base_url, "default", root, home, 120.0)
    finally:
        launch.doc_block = original
    return first_request_lists_tools(dump)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, check="a run's first request lacked construct's tools")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args(argv)
    reason = launch.missing("codex")
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    ready = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            ok = one_run(Path(tmp) / f"run{n}")
            ready += ok
            print(f"run {n + 1}: {'tools listed' if ok else 'no construct tool'}", file=sys.stderr)
    print(f"ready in {ready} of {args.runs} runs")
    target = Check(
        "construct's tools in every run's first request", ready == args.runs, f"{ready} of {args.runs}"
    )
    return conclude([target], check=args.check)


if __name__ == "__main__":
    sys.exit(main())
