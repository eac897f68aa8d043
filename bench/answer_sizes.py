"""How much a host pays, in characters, for the answers it gets (not a test: run it and read the figures).

Two scenarios.

**Compact answers (issue 21 §3).** The default chain on the inline backend with short outputs,
driven to the end through a real MCP client (and once more with a gate before the engineer). For
each answer, its text content's characters (the JSON a host model reads) against its target: an
answer that hands out a host task at most that task's prompt (system + user) plus
:data:`TASK_ANSWER_OVERHEAD` characters; an answer that hands out nothing (a gate, the end) at most
:data:`EMPTY_ANSWER_CHARS`.

**Large outputs.** The default chain (architect -> engineer -> reviewer) on the inline backend, through a real
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

    python bench/answer_sizes.py [--output-chars 100000] [--check]
"""

from __future__ import annotations

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

from bench.harness import Check, conclude, parser
from server.app import ConstructApp
from server.settings.config import load_settings

#: The most an answer may weigh against the prompt it carries.
MAX_RATIO = 1.2
#: The most ``tools/list`` may weigh, in bytes (nine tools: about 1.4 KB each, with their schemas).
MAX_TOOLS_LIST_BYTES = 13_000
#: How long the host's outputs are in the compact scenario ("short outputs": a paragraph).
SHORT_OUTPUT_CHARS = 150
#: The most an answer that hands out a host task may add to that task's prompt, in characters.
TASK_ANSWER_OVERHEAD = 1_200
#: The most an answer that hands out nothing may weigh, in characters.
EMPTY_ANSWER_CHARS = 1_500


@dataclass(frozen=True)
class Answer:
    """One answer of the compact scenario: what call it answered, its text's characters, and the
    prompt characters of the host task it hands out (0: it hands out none)."""

    call: str
    chars: int
    prompt_chars: int

    @property
    def limit(self) -> int:
        return self.prompt_chars + TASK_ANSWER_OVERHEAD if self.prompt_chars else EMPTY_ANSWER_CHARS

    @property
    def held(self) -> bool:
        return self.chars <= self.limit


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
        text_chars = structured_chars = 0
        system, user = action.get("system_prompt", ""), action.get("user_prompt", "")
        while True:  # the answer, then each part of a prompt too long for one answer
            text_chars += len("".join(block.text for block in result.content if block.type == "text"))
            structured_chars += len(
                json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
            )
            if action["kind"] != "read_prompt":
                break
            result = await client.call_tool(action["tool"], action["arguments"])
            part = _data(result)
            system, user = part.get("system_prompt", system), user + part["text"]
            action = part["next_action"]
        return Figures(
            text_chars=text_chars,
            structured_chars=structured_chars,
            prompt_chars=len(system) + len(user),
            tools_list_bytes=tools_list_bytes,
        )


def _answer(call: str, result: Any) -> Answer:
    action = _data(result)["next_action"]
    prompt = len(action.get("system_prompt", "")) + len(action.get("user_prompt", ""))
    text = "".join(block.text for block in result.content if block.type == "text")
    return Answer(call, len(text), prompt)


async def measure_compact(home: Path, approve_before: tuple[str, ...] = ()) -> list[Answer]:
    """Drive the default chain to the end (inline, short outputs, approving every gate) and size
    every answer on the way."""
    settings = load_settings(env={"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1"})
    answers: list[Answer] = []
    async with Client(ConstructApp(settings).build_server()) as client:
        arguments: dict[str, Any] = {"request": "Build a URL shortener"}
        if approve_before:
            arguments["approve_before"] = list(approve_before)
        result = await client.call_tool("orchestrate_start", arguments)
        answers.append(_answer("orchestrate_start", result))
        while (action := _data(result)["next_action"])["kind"] in ("run_host_task", "approve"):
            call = dict(action["arguments"])
            if action["kind"] == "run_host_task":
                call["output"] = host_output(action["task_id"], SHORT_OUTPUT_CHARS)
                label = f"orchestrate_resume {action['task_id']}"
            else:
                label = f"orchestrate_approve {action['gate_id']}"
            result = await client.call_tool(action["tool"], call)
            answers.append(_answer(label, result))
        run_id = _data(result)["run_id"]
        result = await client.call_tool("run_status", {"run_id": run_id})
        answers.append(_answer("run_status (ended)", result))
    return answers


def compact_report(answers: list[Answer], label: str) -> str:
    lines = [f"compact answers: {label}"]
    for a in answers:
        hands = f"prompt {a.prompt_chars} + {TASK_ANSWER_OVERHEAD}" if a.prompt_chars else "hands out nothing"
        lines.append(
            f"  {a.call:<34} {a.chars:>6} chars  (target <= {a.limit:>5}: {hands}; "
            f"{a.chars - a.prompt_chars:>5} besides the prompt)"
        )
    return "\n".join(lines)


def compact_check(answers: list[Answer], label: str) -> Check:
    over = [f"{a.call} {a.chars} > {a.limit}" for a in answers if not a.held]
    return Check(
        f"compact answers, {label}: each within its target",
        not over,
        "; ".join(over) if over else f"{len(answers)} answers",
    )


def report(figures: Figures, output_chars: int) -> str:
    return "\n".join(
        [
            f"scenario: default chain, inline, architect and engineer outputs of {output_chars} chars each;",
            "the answer to the engineer's orchestrate_resume (hands out the reviewer's task)",
            f"  reviewer prompt (system + user):  {figures.prompt_chars:>9} chars",
            f"  answer text content:              {figures.text_chars:>9} chars  "
            f"{figures.text_ratio:.2f}x the prompt",
            f"  answer structured content (JSON): {figures.structured_chars:>9} chars  "
            f"{figures.structured_ratio:.2f}x the prompt",
            f"tools/list: {figures.tools_list_bytes} bytes",
        ]
    )


def checks(figures: Figures) -> list[Check]:
    return [
        Check(
            f"answer text content at most {MAX_RATIO}x the prompt",
            figures.text_ratio <= MAX_RATIO,
            f"{figures.text_ratio:.2f}x",
        ),
        Check(
            f"answer structured content at most {MAX_RATIO}x the prompt",
            figures.structured_ratio <= MAX_RATIO,
            f"{figures.structured_ratio:.2f}x",
        ),
        Check(
            f"tools/list at most {MAX_TOOLS_LIST_BYTES:,} bytes",
            figures.tools_list_bytes <= MAX_TOOLS_LIST_BYTES,
            f"{figures.tools_list_bytes:,} bytes",
        ),
    ]


def main() -> int:
    p = parser(__doc__, check="a figure is over its target")
    p.add_argument("--output-chars", type=int, default=100_000)
    args = p.parse_args()
    logging.disable(logging.INFO)  # the server's start/stop lines would interleave with the figures
    targets: list[Check] = []
    for label, gates in (
        ("default chain, inline, short outputs", ()),
        ("with a gate before engineer", ("engineer",)),
    ):
        with tempfile.TemporaryDirectory() as home:
            answers = anyio.run(measure_compact, Path(home), gates)
        print(compact_report(answers, label))
        targets.append(compact_check(answers, label))
    with tempfile.TemporaryDirectory() as home:
        figures = anyio.run(measure, Path(home), args.output_chars)
    print(report(figures, args.output_chars))
    return conclude([*targets, *checks(figures)], check=args.check)


if __name__ == "__main__":
    raise SystemExit(main())
