"""How much a host pays, in characters, for the answers it gets (not a test: run it and read the figures).

Scenario: the default chain (architect -> engineer -> reviewer) on the inline backend, through a real
MCP client talking to the server in process. The host answers the architect's and the engineer's
tasks with outputs of ``--output-chars`` characters each (code-like text: lines, quotes, indentation,
so JSON escaping costs what it costs in real use). The answer to the engineer's ``orchestrate_resume``
hands out the reviewer's task, whose user prompt must carry both outputs. Printed:

* the characters of that answer's text content and of its structured content (as compact JSON),
  each against the characters of the reviewer's prompt (system + user) it carries — the target is
  at most :data:`MAX_RATIO` times: a view carries the upstream outputs once, in the prompt;
* the size of ``tools/list`` in bytes (the JSON a host receives; target at most
  :data:`MAX_TOOLS_LIST_BYTES`).

Sizes are deterministic, so ``tests/unit/server/test_answer_sizes.py`` asserts the targets on the same
scenario.

    python bench/answer_sizes.py [--output-chars 100000]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server.app import ConstructApp
from server.settings.config import load_settings

#: The most an answer may weigh against the prompt it carries.
MAX_RATIO = 1.2
#: The most ``tools/list`` may weigh, in bytes.
MAX_TOOLS_LIST_BYTES = 20_000


@dataclass(frozen=True)
class Figures:
    text_chars: int
    structured_chars: int
    prompt_chars: int
    tools_list_bytes: int

    @property
    def text_ratio(self) -> float:
        return self.text_chars / self.prompt_chars

    @property
    def structured_ratio(self) -> float:
        return self.structured_chars / self.prompt_chars


def host_output(specialist: str, chars: int) -> str:
    """``chars`` characters of code-like text, different for each specialist."""
    lines: list[str] = []
    size = i = 0
    while size < chars:
        line = f'    result_{i} = handle("{specialist}", step={i})  # see the "notes" of part {i % 7}\n'
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)[:chars]


def _data(result: Any) -> dict[str, Any]:
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"the call failed: {result.content}")
    data: dict[str, Any] = result.structured_content
    return data


async def measure(home: Path, output_chars: int = 100_000) -> Figures:
    """Run the scenario on a fresh store under ``home`` and measure the answer it is about."""
    settings = load_settings(env={"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1"})
    async with Client(ConstructApp(settings).build_server()) as client:
        tools = await client.list_tools()
        tools_list_bytes = len(tools.model_dump_json(by_alias=True, exclude_none=True).encode())
        view = _data(await client.call_tool("orchestrate_start", {"request": "Build a URL shortener"}))
        run_id = view["run_id"]
        for task_id in ("architect", "engineer"):
            action = view["next_action"]
            if action.get("task_id") != task_id:
                raise RuntimeError(f"expected the {task_id} task, got {action}")
            result = await client.call_tool(
                "orchestrate_resume",
                {"run_id": run_id, "task_id": task_id, "output": host_output(task_id, output_chars)},
            )
            view = _data(result)
        action = view["next_action"]
        if action.get("task_id") != "reviewer":
            raise RuntimeError(f"expected the reviewer task, got {action}")
        text = "".join(block.text for block in result.content if block.type == "text")
        structured = json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
        return Figures(
            text_chars=len(text),
            structured_chars=len(structured),
            prompt_chars=len(action["system_prompt"]) + len(action["user_prompt"]),
            tools_list_bytes=tools_list_bytes,
        )


def report(figures: Figures, output_chars: int) -> str:
    def verdict(held: bool) -> str:
        return "ok" if held else "OVER TARGET"

    return "\n".join(
        [
            f"scenario: default chain, inline, architect and engineer outputs of {output_chars} chars each;",
            "the answer to the engineer's orchestrate_resume (hands out the reviewer's task)",
            f"  reviewer prompt (system + user):  {figures.prompt_chars:>9} chars",
            f"  answer text content:              {figures.text_chars:>9} chars  "
            f"{figures.text_ratio:.2f}x the prompt  ({verdict(figures.text_ratio <= MAX_RATIO)}, "
            f"target <= {MAX_RATIO}x)",
            f"  answer structured content (JSON): {figures.structured_chars:>9} chars  "
            f"{figures.structured_ratio:.2f}x the prompt  ({verdict(figures.structured_ratio <= MAX_RATIO)}, "
            f"target <= {MAX_RATIO}x)",
            f"tools/list: {figures.tools_list_bytes} bytes "
            f"({verdict(figures.tools_list_bytes <= MAX_TOOLS_LIST_BYTES)}, "
            f"target <= {MAX_TOOLS_LIST_BYTES})",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output-chars", type=int, default=100_000)
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the server's start/stop lines would interleave with the figures
    with tempfile.TemporaryDirectory() as home:
        figures = anyio.run(measure, Path(home), args.output_chars)
    print(report(figures, args.output_chars))


if __name__ == "__main__":
    main()
