"""The compact answer (server.views.compact): what it keeps, what it leaves to detail='full', and
that it validates against the outputSchema run_status publishes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # ships no type information
from mcp import Client

from server.app import ConstructApp
from server.settings.config import load_settings


def _app(home: Path) -> ConstructApp:
    return ConstructApp(load_settings(env={"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1"}))


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error and result.structured_content is not None, result.content
    data: dict[str, Any] = result.structured_content
    return data


def _keys(data: Any) -> set[str]:
    """Every key at any depth of ``data``."""
    if isinstance(data, dict):
        return set(data) | {k for v in data.values() for k in _keys(v)}
    if isinstance(data, list):
        return {k for v in data for k in _keys(v)}
    return set()


def _nulls_or_empties(data: Any, path: str = "") -> list[str]:
    if isinstance(data, dict):
        found = [path] if data == {} else []
        return found + [p for k, v in data.items() for p in _nulls_or_empties(v, f"{path}/{k}")]
    if isinstance(data, list):
        found = [path] if data == [] else []
        return found + [p for i, v in enumerate(data) for p in _nulls_or_empties(v, f"{path}/{i}")]
    return [path] if data is None else []


async def test_compact_answers_leave_the_record_to_the_full_view(tmp_path: Path) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        schema = next(t for t in (await client.list_tools()).tools if t.name == "run_status").output_schema
        assert schema is not None
        view = await _call(
            client, "orchestrate_start", {"request": "Build it", "approve_before": ["engineer"]}
        )
        run_id = view["run_id"]
        answers = [view]
        view = await _call(
            client, "orchestrate_resume", {"run_id": run_id, "task_id": "architect", "output": "the design"}
        )
        answers.append(view)
        assert view["next_action"]["kind"] == "approve"
        assert view["gates"] == [
            {
                "gate_id": "before:engineer",
                "task_id": "engineer",
                "position": "before",
                "status": "requested",
                "decisions": ["approve", "reject", "revise"],
            }
        ]
        view = await _call(
            client, "orchestrate_approve", view["next_action"]["arguments"] | {"comment": "go"}
        )
        answers.append(view)
        # A task whose output the handed-out prompt carries shows no preview: it travels once.
        assert view["tasks"][0] == {
            "task_id": "architect",
            "status": "done",
            "output_chars": 10,
            "output_uri": f"run://{run_id}/tasks/architect/output",
        }
        assert "the design" in view["next_action"]["user_prompt"]
        for task_id in ("engineer", "reviewer"):
            view = await _call(
                client,
                "orchestrate_resume",
                {"run_id": run_id, "task_id": task_id, "output": f"{task_id} work"},
            )
            answers.append(view)
        assert view["status"] == "completed" and view["next_action"]["kind"] == "none"
        # At the end, no prompt carries the outputs: each task shows its preview.
        assert [t.get("output_preview") for t in view["tasks"]] == [
            "the design",
            "engineer work",
            "reviewer work",
        ]
        answers.append(await _call(client, "run_status", {"run_id": run_id}))
        full = await _call(client, "run_status", {"run_id": run_id, "detail": "full"})

    record = {"chain", "contract", "attempts", "telemetry", "totals", "semantics", "version", "created_at"}
    record |= {"updated_at", "started_at", "finished_at", "requested_at", "decided_at", "request_preview"}
    for answer in answers:
        jsonschema.validate(answer, schema)
        assert not (_keys(answer) & record), _keys(answer) & record
        assert _nulls_or_empties(answer) == [], _nulls_or_empties(answer)
    # The full view has the record, every whole output and the request.
    assert record <= _keys(full) | {"request_preview"}
    assert full["tasks"][0]["output"] == "the design" and full["request"] == "Build it"
    jsonschema.validate(full, schema)


async def test_costs_appear_once_something_is_spent(tmp_path: Path) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        view = await _call(client, "orchestrate_start", {"request": "x", "chain": ["writer"]})
        assert "costs" not in view
        view = await _call(
            client,
            "orchestrate_resume",
            {
                "run_id": view["run_id"],
                "task_id": "writer",
                "output": "text",
                "usage": {"input_tokens": 12, "output_tokens": 3, "cost_usd": 0.002},
            },
        )
    assert view["costs"] == {"input_tokens": 12, "output_tokens": 3, "cost_usd": 0.002}
