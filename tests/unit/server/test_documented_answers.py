"""The tool reference (docs/tools.md) shows the answers the server gives: each example answer of
"## The tools" is what the same calls answer now (the run id is the page's; an abridged prompt,
its pieces between "…", appears in the real prompt in order)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mcp import Client

from server.app import ConstructApp
from server.settings.config import load_settings

PAGE = Path(__file__).resolve().parents[3] / "docs" / "tools.md"


def _blocks() -> list[dict[str, Any]]:
    section = PAGE.read_text("utf-8").split("\n## The tools\n", 1)[1].split("\n### Errors\n", 1)[0]
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)\n```", section, re.S)]


def _abridged(shown: str, real: str) -> bool:
    at = 0
    for piece in (p.strip() for p in shown.split("…")):
        found = real.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def _same(shown: Any, real: Any, path: str = "") -> list[str]:
    """Where ``shown`` (from the page) differs from ``real``."""
    if isinstance(shown, dict) and isinstance(real, dict):
        if set(shown) != set(real):
            return [f"{path}: keys {sorted(set(shown) ^ set(real))}"]
        return [d for k in shown for d in _same(shown[k], real[k], f"{path}/{k}")]
    if isinstance(shown, list) and isinstance(real, list) and len(shown) == len(real):
        return [
            d for i, (a, b) in enumerate(zip(shown, real, strict=True)) for d in _same(a, b, f"{path}/{i}")
        ]
    if isinstance(shown, str) and isinstance(real, str) and "…" in shown:
        return [] if _abridged(shown, real) else [f"{path}: {shown[:60]!r} is not abridged from the answer"]
    return [] if shown == real else [f"{path}: {shown!r} != {real!r}"]


async def test_the_readme_shows_the_answers_the_tools_give(tmp_path: Path) -> None:
    blocks = _blocks()
    calls = [b for b in blocks if "name" in b]
    shown = [b for b in blocks if "run_id" in b]
    readme_run_id = shown[0]["run_id"]
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1"})
    answers: list[dict[str, Any]] = []
    async with Client(ConstructApp(settings).build_server()) as client:
        run_id = ""
        for call in calls:
            arguments = json.loads(
                json.dumps(call["arguments"]).replace(readme_run_id, run_id or readme_run_id)
            )
            result = await client.call_tool(call["name"], arguments)
            assert not result.is_error, result.content
            answer = result.structured_content or {}
            run_id = answer["run_id"]
            answers.append(answer)
        # ... "and so on until the end": the engineer's and the reviewer's tasks.
        for task_id in ("engineer", "reviewer"):
            result = await client.call_tool(
                "orchestrate_resume", {"run_id": run_id, "task_id": task_id, "output": f"{task_id} output"}
            )
            answers.append(result.structured_content or {})
    real = [json.loads(json.dumps(a).replace(run_id, readme_run_id)) for a in answers]
    # The page shows the answers to the start, the architect's output and the end.
    for example, answer in zip(shown, [real[0], real[1], real[-1]], strict=True):
        assert _same(example, answer) == []
