from __future__ import annotations

import hashlib

from orchestration.chains.prompts import TaskPrompt, materialize
from orchestration.core import StartRequest
from tests.unit.helpers import make_runtime, play


async def test_same_record_same_prompt_and_only_persisted_inputs() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Make a game", approve_before=("reviewer",)))
    await play(runtime, head.run_id, output=lambda t: f"the {t}'s work")
    final = await runtime.status(head.run_id)
    outputs = await runtime.outputs(final)
    # A second runtime on the same store (a restarted server) materializes the same bytes.
    other = make_runtime(store=runtime.store)  # type: ignore[arg-type]
    for task in (await runtime.snapshot(head.run_id)).head.tasks:
        a = await runtime.prompt_for(final, task.task_id)
        b = await other.prompt_for(await other.status(head.run_id), task.task_id)
        assert a == b
        assert a.sha256 == task.prompt_sha256, "the prompt shown equals the prompt prepared"
    reviewer = materialize(final, "reviewer", outputs)
    assert reviewer.user.index("the architect's work") < reviewer.user.index("the engineer's work")
    assert "ok before:reviewer" in reviewer.user, "approver notes reach the next specialist"
    assert "Make a game" in reviewer.user
    architect = materialize(final, "architect", {})
    assert "Work so far" not in architect.user


def test_a_prompts_digest_is_the_sha256_of_its_text_with_non_ascii_parts() -> None:
    # Hashed part by part (no joined copy): the digest must stay the one of the joined UTF-8 text
    # that older records hold, whatever characters either part has.
    for system, user in (
        ("plain", "text"),
        ("a \u2013 dash", "\u00fcn\u00efcode \u2713"),
        ("", ""),
        ("sys", ""),
    ):
        prompt = TaskPrompt("t", "s", system, user)
        assert prompt.sha256 == hashlib.sha256(f"{system}\x00{user}".encode()).hexdigest()
