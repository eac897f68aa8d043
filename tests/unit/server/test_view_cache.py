"""``Services.view`` reads a run's log once per version (issue 11): a host polling ``run_status``
on a run that does not move costs one head read per call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestration.core.facts import Fact
from orchestration.core.inputs import StartRequest
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.reading import RunSnapshot
from server.identity import LOCAL, Caller, NamedToken, Role, caller_for
from server.mcp import services as services_module
from server.mcp import shown_runs as memory_module
from server.mcp.services import Services
from server.mcp.shown_runs import ShownRuns
from server.mcp.subscriptions import LegacySubscribers, RunEventBus
from server.settings.config import Settings
from server.views.compact import WITHHELD, answer_data, answer_text
from server.views.run_view import Detail, RunView, run_view
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.log_reads = 0

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        self.log_reads += 1
        return await super().read_facts(run_id, after_seq, limit)


def services_on(store: MemoryStore, home: Path) -> Services:
    runtime = make_runtime(store)
    return Services(
        settings=Settings(home=home),
        runtime=runtime,
        dispatcher=Dispatcher(runtime),
        bus=RunEventBus(),
        legacy_subscribers=LegacySubscribers(),
        store_description="memory",
        memory=ShownRuns(10_000),
    )


async def test_a_version_viewed_again_is_not_read_again_and_a_new_one_is(tmp_path: Path) -> None:
    store = CountingStore()
    services = services_on(store, tmp_path)
    runtime = services.runtime
    head, _ = await runtime.start(StartRequest(request="x", chain=("architect", "engineer")))
    await runtime.drive(head.run_id)
    first = await services.whole_view(head.run_id)
    reads = store.log_reads
    assert await services.whole_view(head.run_id) == first
    assert await services.whole_view(head.run_id, detail="full") is not None
    assert store.log_reads == reads
    # The run moves on: the new version is read from the store.
    assert first.next_action.kind == "run_host_task"
    await runtime.submit_host_output(head.run_id, "architect", "the design")
    await runtime.drive(head.run_id)
    reads = store.log_reads
    second = await services.whole_view(head.run_id)
    assert store.log_reads == reads + 1
    assert second != first


async def test_a_versions_compact_view_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compact view is a pure function of the version's snapshot: a host polling a run that
    does not move gets the view built the first time (a frozen model, shared as it is)."""
    built: list[str] = []

    def counting(snapshot: RunSnapshot, detail: Detail = "compact", full_task: str | None = None) -> RunView:
        built.append(detail)
        return run_view(snapshot, detail, full_task)

    monkeypatch.setattr(services_module, "run_view", counting)
    monkeypatch.setattr(memory_module, "run_view", counting)
    services = services_on(MemoryStore(), tmp_path)
    head, _ = await services.runtime.start(StartRequest(request="x", chain=("architect",)))
    await services.runtime.drive(head.run_id)
    first = await services.whole_view(head.run_id)
    assert await services.whole_view(head.run_id) is first and built == ["compact"]
    # Other details are built at each call (a whole output is not kept twice).
    await services.whole_view(head.run_id, detail="full")
    await services.whole_view(head.run_id, full_task="architect")
    assert built == ["compact", "full", "compact"]
    await services.runtime.submit_host_output(head.run_id, "architect", "the design")
    assert (await services.whole_view(head.run_id)).status != first.status and built[-1] == "compact"


async def test_a_kept_compact_views_answer_is_dumped_once_and_never_stale(tmp_path: Path) -> None:
    """``Services.answer_of``: the answer of a kept compact view is its dump, computed once; a view
    of a new version, a full view or a view with something added (a copy) is dumped afresh."""
    services = services_on(MemoryStore(), tmp_path)
    head, _ = await services.runtime.start(StartRequest(request="x", chain=("architect", "engineer")))
    await services.runtime.drive(head.run_id)
    first = await services.whole_view(head.run_id)
    text, structured = services.answer_of(first)
    assert (text, structured) == (answer_text(answer_data(first)), answer_data(first))
    again = services.answer_of(await services.whole_view(head.run_id))
    assert again[0] is text and again[1] is structured
    # Not kept: dumped at each call, and what it shows.
    full = await services.whole_view(head.run_id, detail="full")
    whole = services.answer_of(full)[0]
    assert json.loads(whole) == json.loads(full.model_dump_json()) and whole != text
    assert whole.startswith('{"next_action":')
    changed = first.model_copy(update={"warnings": ["added"]})
    assert services.answer_of(changed)[0] == answer_text(answer_data(changed)) != text
    assert services.answer_of(first)[0] is text  # a copy did not replace the kept answer
    # The run moves on: the next version's answer, not the kept one.
    await services.runtime.submit_host_output(head.run_id, "architect", "the design")
    await services.runtime.drive(head.run_id)
    second = await services.whole_view(head.run_id)
    assert services.answer_of(second)[0] == answer_text(answer_data(second)) != text
    assert services.answer_of(second)[0] is services.answer_of(second)[0]


async def test_a_caller_who_may_not_read_the_run_is_answered_without_its_content(tmp_path: Path) -> None:
    """Issue 22, finding 13: Services.view (every answer's view) withholds a run's content from an
    identity that may neither read the run nor started it; its owner and its readers see it."""
    services = services_on(MemoryStore(), tmp_path)
    runtime = services.runtime
    start = StartRequest(request="the secret request", chain=("architect", "engineer"), started_by="alice")
    head, _ = await runtime.start(start)
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "the secret design")
    await runtime.drive(head.run_id)

    def token(identity: str, *roles: Role) -> Caller:
        return caller_for(NamedToken(identity, f"{identity}-token-0123456789", frozenset(roles)))

    operator = answer_data(await services.view(head.run_id, caller=token("olga", "operate")))
    shown = answer_text(operator)
    assert "secret" not in shown and operator["withheld"] is True
    assert operator["next_action"]["kind"] == "run_host_task"
    assert operator["next_action"]["user_prompt"] == WITHHELD
    assert operator["tasks"][0] == {
        "task_id": "architect",
        "status": "done",
        "output_chars": len("the secret design"),
        "output_uri": f"run://{head.run_id}/tasks/architect/output",
    }
    for reader in (token("alice", "operate"), token("rita", "read"), LOCAL):
        seen = answer_text(answer_data(await services.view(head.run_id, caller=reader)))
        assert "the secret design" in seen and "withheld" not in seen
