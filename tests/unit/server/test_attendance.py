"""A run whose driver died is shown as what it is (server/views/attendance.py): the rule (active
status, no unexpired lease, past the grace), and where it is shown — the page's run and list
endpoints, the CLI's run view and list — while the MCP ``wait`` no longer says the server works
on it."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestration.core import RunStatus
from orchestration.core.clock import ManualClock
from orchestration.store import Lease
from server.cli.grammar import build_parser
from server.cli.main import _runs_with
from server.mcp.services import Services
from server.views.attendance import GRACE_SECONDS, unattended
from server.web.pages import with_run_pages
from stores.memory import MemoryStore
from tests.stores.builders import BASE_TIME, new_run, run_id, start_attempt
from tests.unit.helpers import make_runtime
from tests.unit.server.test_view_cache import services_on

RUN = run_id(1)


def lease(expires_in: float) -> Lease:
    return Lease(RUN, "host:1:abcd", BASE_TIME + timedelta(seconds=expires_in), "t")


def running() -> Any:
    head, facts = new_run(RUN)
    write = start_attempt(head)
    return write.head, [*facts, *write.facts]


def test_the_rule_active_without_a_live_lease_past_the_grace() -> None:
    head, _ = running()
    assert head.status == RunStatus.RUNNING
    written = head.updated_at
    # A live lease: driven, whatever the time.
    assert unattended(head, lease(30), BASE_TIME) is None
    # Its lease expired: unattended once the grace has passed, since the expiry.
    expired = lease(-60)
    found = unattended(head, expired, BASE_TIME, "--home /h")
    assert found is not None and found.lease_expired and found.since == expired.expires_at
    assert found.continue_with == f"construct-mcp runs resume {RUN} --home /h"
    assert unattended(head, lease(-1), BASE_TIME) is None  # within the grace: a server may claim it
    # Running with no lease at all (released: its driver stopped): at once, since its last write.
    found = unattended(head, None, written + timedelta(seconds=1))
    assert found is not None and not found.lease_expired and found.since == written
    # Queued with no lease: once the grace has passed (a server's dispatcher claims it meanwhile).
    queued = head.model_copy(update={"status": RunStatus.QUEUED})
    assert unattended(queued, None, written + timedelta(seconds=1)) is None
    assert unattended(queued, None, written + timedelta(seconds=GRACE_SECONDS + 1)) is not None


def test_a_run_paused_ended_or_waiting_for_its_retry_time_is_not_unattended() -> None:
    head, _ = running()
    late = head.updated_at + timedelta(hours=1)
    for status in (RunStatus.AWAITING_HOST, RunStatus.AWAITING_APPROVAL, RunStatus.COMPLETED):
        assert unattended(head.model_copy(update={"status": status}), None, late) is None
    queued = head.model_copy(update={"status": RunStatus.QUEUED, "not_before": late + timedelta(minutes=1)})
    assert unattended(queued, None, late) is None
    assert unattended(queued.model_copy(update={"not_before": late}), None, late) is not None


async def orphan(store: MemoryStore) -> None:
    head, facts = new_run(RUN)
    await store.create(head, facts[:1])
    write = start_attempt(head)
    await store.append(RUN, head.version, write.facts, write.head)


async def get(services: Services, path: str) -> dict[str, Any]:
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000")],
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "http_version": "1.1",
    }
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    async def not_mcp(_scope: Any, _receive: Any, _send: Any) -> None:
        raise AssertionError("a /runs request reached the /mcp app")

    await with_run_pages(not_mcp, lambda: services, [], "127.0.0.1", 10_000)(scope, receive, send)
    assert sent[0]["status"] == 200, sent
    data: dict[str, Any] = json.loads(b"".join(m.get("body", b"") for m in sent if "body" in m))
    return data


async def test_the_page_says_nobody_drives_the_run_and_the_command_that_continues_it(tmp_path: Path) -> None:
    store = MemoryStore()
    await orphan(store)
    services = services_on(store, tmp_path)
    clock = services.runtime.clock
    assert isinstance(clock, ManualClock) and clock.now() == BASE_TIME
    clock.advance(300)
    view = await get(services, f"/runs/api/runs/{RUN}")
    assert view["next_action"]["kind"] == "wait"
    assert view["unattended"]["continue_with"] == f"construct-mcp runs resume {RUN}"
    assert "server is working" not in view["next_action"]["instruction"]
    listed = await get(services, "/runs/api/runs")
    assert listed["runs"][0]["unattended"]["since"].startswith("2026-01-01T00:00:01")
    # Driven again (a live lease): nothing is said.
    assert await store.claim_lease(RUN, "someone", 30, clock.now()) is not None
    assert "unattended" not in await get(services, f"/runs/api/runs/{RUN}")
    assert "unattended" not in (await get(services, "/runs/api/runs"))["runs"][0]


@pytest.mark.parametrize("argv", [["status", RUN], ["list"]])
async def test_the_cli_says_nobody_drives_the_run_never_that_a_server_works_on_it(
    tmp_path: Path, argv: list[str]
) -> None:
    store = MemoryStore()
    await orphan(store)
    runtime = make_runtime(store, clock=ManualClock(BASE_TIME + timedelta(minutes=5)))
    out = io.StringIO()
    assert await _runs_with(runtime, build_parser().parse_args(["runs", *argv]), out) == 0
    printed = out.getvalue()
    assert "nobody" in printed and f"construct-mcp runs resume {RUN}" in printed, printed
    assert "working on it" not in printed
