"""What an agent answers is checked before it is recorded (issue 22, finding 6), and what a
delegation carries is recorded and sent on (finding 2), on every store.

The agent is the scripted construct-mcp of ``tests/unit/server/test_agent_runs.py`` (or a plain
tool), made to answer what a broken or hostile remote would: a 2,000,000-character run id, the run
id ``../../../etc/passwd``, a 5,000,000-character output (a remote run's, a plain tool's). Each is a
typed error (``agent_answer_refused``, not retried), and nothing of the answer is in the run's record: no
``remote_run_started`` with a bad id, no bad id followed, no output."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import CallToolResult

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.store import RunStore
from tests.unit.helpers import play
from tests.unit.server.test_agent_runs import REVIEW, FakeRemote, agent_worker, result, runtime_for

LIMIT = 1_000_000  # max_output_chars, the default
SEARCH: dict[str, Any] = {
    "name": "review",
    "agent": "reviewer2",
    "tool": "search",
    "arguments": {"q": "{request}"},
}


class Remote(FakeRemote):
    """The scripted construct-mcp, answering ``start_id`` as its run's id, ``output`` as its
    last task's output, or ``tool_text`` (an error when ``tool_error``) for any other tool."""

    def __init__(
        self,
        start_id: Any = None,
        output: str = "remote verdict",
        tool_text: str = "found",
        tool_error: bool = False,
        run_error: str | None = None,
    ) -> None:
        super().__init__(polls=1, final="completed" if run_error is None else "failed")
        self.start_id, self.output, self.tool_text = start_id, output, tool_text
        self.tool_error, self.run_error = tool_error, run_error

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any
    ) -> CallToolResult:
        if name not in ("orchestrate_start", "run_status", "orchestrate_cancel"):
            self.calls.append((name, dict(arguments or {})))
            return result(text=self.tool_text, error=self.tool_error)
        answer = await super().call_tool(name, arguments, *args, **kwargs)
        view = dict(answer.structured_content or {})
        if name == "orchestrate_start" and self.start_id is not None:
            return result({**view, "run_id": self.start_id})
        if name == "run_status" and "tasks" in view:
            tasks = [{**t, "output": self.output} for t in view["tasks"]]
            error = None if self.run_error is None else {"code": "failed", "message": self.run_error}
            return result({**view, "tasks": tasks, "error": error})
        return answer


def runtime_with(
    store: RunStore,
    remote: FakeRemote,
    step: dict[str, Any] = REVIEW,
    clock: ManualClock | None = None,
    owner: str = "p1",
) -> Runtime:
    return runtime_for(store, agent_worker(remote), owner, clock, step)


async def record_of(store: RunStore, head: RunHead) -> str:
    facts = await store.read_facts(head.run_id)
    return head.model_dump_json() + "".join(f.model_dump_json() for f in facts)


async def failed_review(store: RunStore, remote: FakeRemote, step: dict[str, Any] = REVIEW) -> str:
    """Drive the delegating run to its end: it must fail at the review step after one attempt;
    the error's code, the record checked for what must not be in it (no output for the step,
    nothing of the answer's size)."""
    runtime = runtime_with(store, remote, step)
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    done = await play(runtime, head.run_id)
    assert done.status == RunStatus.FAILED and done.error is not None, done.error
    facts = await store.read_facts(head.run_id)
    assert not [f for f in facts if f.type == "task_completed" and getattr(f, "task_id", "") == "review"]
    review = (await runtime.snapshot(head.run_id)).head.task("review")
    assert len(review.attempts) == 1, "not retried"
    error = review.attempts[0].error
    assert error is not None and not error.retryable and len(error.message) < 1_000, error
    assert len(await record_of(store, done)) < 100_000, "the answer was recorded"
    return error.code


@pytest.mark.parametrize("bad_id", ["r" * 2_000_000, "../../../etc/passwd", "Run-ID", "ab"])
async def test_a_remote_run_id_outside_the_grammar_is_refused_and_never_followed(
    store: RunStore, bad_id: str
) -> None:
    remote = Remote(start_id=bad_id)
    assert await failed_review(store, remote) == "agent_answer_refused"
    (run,) = (await store.list_runs()).runs
    assert not [f for f in await store.read_facts(run.run_id) if f.type == "remote_run_started"]
    assert [name for name, _ in remote.calls] == ["orchestrate_start"], "the bad id was followed"


async def test_a_remote_output_over_max_output_chars_is_refused(store: RunStore) -> None:
    assert await failed_review(store, Remote(output="x" * 5_000_000)) == "agent_answer_refused"


async def test_an_output_at_max_output_chars_is_recorded(store: RunStore) -> None:
    runtime = runtime_with(store, Remote(output="x" * LIMIT))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    done = await play(runtime, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert len((await runtime.snapshot(head.run_id)).outputs["review"]) == LIMIT


async def test_a_plain_tools_text_over_max_output_chars_is_refused(store: RunStore) -> None:
    assert await failed_review(store, Remote(tool_text="y" * (LIMIT + 1)), SEARCH) == "agent_answer_refused"
