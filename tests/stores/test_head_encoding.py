"""The stored form of a head (stores._common.encode_head) encodes the chain snapshot and each task
once per object and puts them back in place (issue 11): the text must stay exactly the pydantic
dump it always was, whatever the head holds and whatever its strings contain."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestration.core.models import RunHead
from stores import _common
from stores._common import decode_stored_head, encode_head
from tests.stores.builders import (
    BASE_TIME,
    cancel,
    complete_task,
    fail_attempt,
    new_run,
    request_approval,
    run_id,
    start_attempt,
)

#: strings that look like the keys the encoder splices at, quotes and backslashes included
TRICKY = 'a ,"chain_hash":"x" ,"gates":[] \\ \\",\\"gates\\": \x00 \ue000 é'


def plain_dump(head: RunHead) -> str:
    data = head.model_dump_json(exclude_defaults=True)
    return data if '"format":' in data[-14:] else f'{data[:-1]},"format":{head.format}}}'


def heads() -> list[RunHead]:
    head, _ = new_run(run_id(1), request=TRICKY, key=TRICKY, deadline_at=BASE_TIME + timedelta(hours=1))
    found = [head, start_attempt(head).head]
    found.append(fail_attempt(found[-1], BASE_TIME + timedelta(minutes=5)).head)
    found.append(complete_task(found[-1], output=TRICKY).head)
    found.append(complete_task(found[-1], "engineer").head)
    found.append(request_approval(found[-1]).head)
    found.append(cancel(found[-1]).head)
    return found


def test_every_head_encodes_exactly_as_its_plain_dump() -> None:
    for head in heads():
        assert encode_head(head) == plain_dump(head)
        # And again, now from the cached parts.
        assert encode_head(head) == plain_dump(head)
        assert decode_stored_head(head.run_id, "head", encode_head(head), str) == head


def test_a_head_copied_with_other_tasks_or_another_chain_encodes_its_own() -> None:
    head = heads()[3]
    other = heads()[0]
    swapped = head.model_copy(update={"tasks": other.tasks, "chain": other.chain.model_copy()})
    assert encode_head(head) == plain_dump(head)
    assert encode_head(swapped) == plain_dump(swapped)


def test_the_tasks_remembered_from_the_run_s_last_head_are_never_stale() -> None:
    """encode_head compares a head's tasks with those of the run's last encoded head by identity
    and reuses their texts: a task replaced (same count of tasks), heads encoded out of order, and
    another run's heads in between each still encode as their plain dump."""
    found = heads()
    started, failed, done = found[1], found[2], found[3]
    assert len(started.tasks) == len(failed.tasks) == len(done.tasks)
    assert started.tasks[0] is not failed.tasks[0]
    other, _ = new_run(run_id(2))
    for head in (started, failed, other, done, failed, started, done, done):
        assert encode_head(head, with_chain=False) == _without_chain(head)


def test_the_run_cache_keeps_the_runs_encoded_last_and_forgets_ended_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_common, "LAST_TASKS_LIMIT", 2)
    monkeypatch.setattr(_common, "_LAST_TASKS", {})  # not what earlier tests left
    for n in range(1, 6):
        head, _ = new_run(run_id(n))
        assert encode_head(head) == plain_dump(head)
        assert len(_common._LAST_TASKS) <= 2
    assert list(_common._LAST_TASKS) == [run_id(4), run_id(5)]
    again, _ = new_run(run_id(4))
    encode_head(again)  # run 4 is now the one encoded last: run 5 goes first past the limit
    encode_head(new_run(run_id(6))[0])
    assert list(_common._LAST_TASKS) == [run_id(4), run_id(6)]
    *going, ended = heads()  # the last one is cancelled
    encode_head(going[-1])
    assert ended.run_id in _common._LAST_TASKS and ended.status.is_terminal
    assert encode_head(ended) == plain_dump(ended)
    assert ended.run_id not in _common._LAST_TASKS


def _without_chain(head: RunHead) -> str:
    data = head.model_dump_json(exclude_defaults=True, exclude={"chain"})
    return data if '"format":' in data[-14:] else f'{data[:-1]},"format":{head.format}}}'
