"""A run's push notification configs as facts (:mod:`orchestration.engine.push_configs`): set,
replaced, removed, bounded, refused on an ended run; the head lists the ids in force, a record of
format 8, and decisions do not change."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestration.core import PushConfigured, StartRequest
from orchestration.core.decide import next_actions
from orchestration.engine import delete_push_config, push_configs_in, set_push_config
from orchestration.errors import InvalidState, TooLarge
from tests.unit.helpers import make_runtime

AT = datetime(2026, 1, 1, tzinfo=UTC)


def config(config_id: str, url: str = "https://hooks.example/a2a") -> PushConfigured:
    return PushConfigured(seq=0, at=AT, config_id=config_id, url=url, sealed_token="v1.sealed")


async def test_configs_are_set_replaced_removed_and_bounded() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest(request="Do it.", chain="default"))
    decided = next_actions(head, runtime.clock.now())
    head, fact = await set_push_config(runtime, head.run_id, config("a"), most=2)
    assert head.push_configs == ("a",) and head.format == 8 and fact.seq == head.last_seq
    assert next_actions(head, runtime.clock.now()) == decided, "a config changes no decision"
    head, _ = await set_push_config(runtime, head.run_id, config("b"), most=2)
    head, _ = await set_push_config(runtime, head.run_id, config("a", "https://hooks.example/new"), most=2)
    assert head.push_configs == ("a", "b"), "a config of the same id replaces it, and counts once"
    with pytest.raises(TooLarge):
        await set_push_config(runtime, head.run_id, config("c"), most=2)
    in_force = push_configs_in(head, await runtime.read_facts(head.run_id))
    assert [(c.config_id, c.url) for c in in_force] == [
        ("a", "https://hooks.example/new"),
        ("b", config("b").url),
    ]

    head = await delete_push_config(runtime, head.run_id, "a", None)
    assert head.push_configs == ("b",)
    again = await delete_push_config(runtime, head.run_id, "a", None)
    assert again.version == head.version, "deleting again records nothing"
    assert "push_configs" not in (await delete_push_config(runtime, head.run_id, "b", None)).model_dump(
        mode="json"
    )


async def test_an_ended_run_takes_no_config() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest(request="Do it.", chain="default"))
    head, _ = await set_push_config(runtime, head.run_id, config("a"), most=10)
    ended = await runtime.cancel(head.run_id)
    with pytest.raises(InvalidState, match="has ended"):
        await set_push_config(runtime, head.run_id, config("b"), most=10)
    assert (await delete_push_config(runtime, head.run_id, "a", None)).version == ended.version
