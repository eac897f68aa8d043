"""The composition root: the one place that builds real objects and wires them together.

:class:`ConstructApp` holds the settings and the catalog (both validated before anything starts, so
a bad config file fails the process at once) and builds the :class:`~mcp.server.MCPServer`. The
server's ``lifespan`` opens the store (wrapped in
:class:`~stores.faults.CrashAfterWrites` when ``CONSTRUCT_FAULT_CRASH_AFTER_WRITES`` is set), builds
the :class:`~orchestration.runtime.Runtime` with an owner unique to this process
(``host:pid:random``) and runs the :class:`~orchestration.dispatcher.Dispatcher` in a task group
for as long as the server runs, whatever the transport. On shutdown it gives runs being driven a
short grace period, stops the dispatcher (a run interrupted mid-step is an orphan that the next
process recovers from its facts), and closes the store.

The SSE transport enters the lifespan once per connection; the app therefore opens its services once
per process and lets later entries share them (see :meth:`ConstructApp.lifespan`).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import anyio
from mcp.server import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus

from orchestration.catalog import Catalog
from orchestration.dispatcher import Dispatcher
from orchestration.runtime import Runtime
from orchestration.store import RunStore
from orchestration.workers.provider import contract_resolver
from server.config import Settings
from server.resources import register_resources
from server.services import LegacySubscribers, Services
from server.storage import OpenedRunStore, open_run_store
from server.tools import register_tools

log = logging.getLogger("construct.server")

Transport = Literal["stdio", "sse", "streamable-http"]

#: How long shutdown waits for runs being driven to reach a step boundary before cancelling them.
SHUTDOWN_GRACE_SECONDS = 5.0

INSTRUCTIONS = """\
construct-mcp runs durable specialist chains (for example architect -> engineer -> reviewer).
Start one with orchestrate_start. Every answer is a run view whose next_action says what to do:
run_host_task (do the task with your own model, then orchestrate_resume with the output),
approve (ask the user, then orchestrate_approve), wait (call run_status later) or none (finished).
Runs survive server restarts: keep the run_id and call run_status to pick a run up again."""


def process_owner() -> str:
    """A lease owner unique to this process: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def build_runtime(settings: Settings, store: RunStore, catalog: Catalog, warnings: list[str]) -> Runtime:
    return Runtime(
        store,
        catalog,
        limits=settings.limits(),
        owner=process_owner(),
        lease_ttl_seconds=settings.lease_ttl_seconds,
        resolve_contract=contract_resolver(settings.worker_backend, None),
        warnings=warnings,
    )


class ConstructApp:
    """Settings + catalog, and the server built from them. One per process."""

    def __init__(self, settings: Settings, catalog: Catalog | None = None) -> None:
        self.settings = settings
        # Loaded here, not in the lifespan: a bad [specialists]/[chains] table must stop the
        # process before it answers anything.
        self.catalog = catalog if catalog is not None else Catalog.load(settings.config_file)
        self._services: Services | None = None

    def build_server(self) -> MCPServer[Services]:
        bus = InMemorySubscriptionBus()
        self._bus = bus
        self._legacy = LegacySubscribers()
        server: MCPServer[Services] = MCPServer(
            "construct-mcp",
            title="construct-mcp: durable specialist chains",
            instructions=INSTRUCTIONS,
            version=_version(),
            lifespan=self.lifespan,
            subscriptions=bus,
            log_level=self.settings.log_level,
        )
        register_tools(server)
        register_resources(server, self._legacy)
        return server

    @asynccontextmanager
    async def lifespan(self, _server: MCPServer[Services]) -> AsyncIterator[Services]:
        if self._services is not None:
            # SSE enters the lifespan once per connection: share the process's services.
            yield self._services
            return
        opened = await open_run_store(self.settings)
        try:
            async with self._running(opened) as services:
                yield services
        finally:
            with anyio.CancelScope(shield=True):
                await opened.store.close()
            log.info("store closed", extra={"action": "store_closed"})

    @asynccontextmanager
    async def _running(self, opened: OpenedRunStore) -> AsyncIterator[Services]:
        settings = self.settings
        runtime = build_runtime(settings, opened.store, self.catalog, list(opened.warnings))
        dispatcher = Dispatcher(
            runtime,
            concurrency=settings.dispatch_concurrency,
            poll_seconds=settings.poll_seconds,
            recover=settings.recover_on_start,
        )
        services = Services(
            settings=settings,
            runtime=runtime,
            dispatcher=dispatcher,
            bus=self._bus,
            legacy_subscribers=self._legacy,
            store_description=opened.description,
            warnings=tuple(opened.warnings),
        )
        runtime.add_listener(services.publish_change)
        for warning in opened.warnings:
            log.warning(warning, extra={"action": "startup_warning"})
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run)
            self._services = services
            _write_pid_file(settings.pid_file)
            log.info(
                "server started: %s",
                " ".join(f"{k}={v}" for k, v in services.describe().items()),
                extra={"action": "server_started", "owner": runtime.owner},
            )
            try:
                yield services
            finally:
                self._services = None
                with anyio.CancelScope(shield=True):
                    # Let runs being driven reach a step boundary; whatever is still running after
                    # the grace period is cancelled and recovered later from its facts.
                    with anyio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                        # The dispatcher signals no "idle" event we could await; a short poll is enough.
                        while dispatcher.active:  # noqa: ASYNC110
                            await anyio.sleep(0.05)
                dispatcher.stop()
                tg.cancel_scope.cancel()
                _remove_pid_file(settings.pid_file)
                log.info("server stopping", extra={"action": "server_stopping", "owner": runtime.owner})

    # -- transports ------------------------------------------------------------------------------

    def serve(self, transport: Transport = "stdio", host: str = "127.0.0.1", port: int = 8000) -> None:
        """Run the server until it is stopped (stdin closed, SIGINT/SIGTERM for HTTP)."""
        anyio.run(self.serve_async, transport, host, port)

    async def serve_async(
        self, transport: Transport = "stdio", host: str = "127.0.0.1", port: int = 8000
    ) -> None:
        server = self.build_server()
        log.info("serving", extra={"action": "serve", "transport": transport})
        if transport == "stdio":
            await server.run_stdio_async()
        elif transport == "streamable-http":
            await server.run_streamable_http_async(host=host, port=port)
        elif transport == "sse":
            # The SSE app enters the lifespan per connection; hold it for the whole process so the
            # store and dispatcher live (and recover runs) even before the first client connects.
            async with self.lifespan(server):
                await server.run_sse_async(host=host, port=port)
        else:  # pragma: no cover - the CLI restricts the choices
            raise ValueError(f"unknown transport {transport!r}")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("construct-mcp")
    except Exception:  # pragma: no cover - running from a source tree without metadata
        return "0"


def _write_pid_file(path: Path | None) -> None:
    # CONSTRUCT_PID_FILE: lets the demo and the crash tests find and SIGKILL this very process.
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{os.getpid()}\n")
    tmp.replace(path)


def _remove_pid_file(path: Path | None) -> None:
    if path is None:
        return
    try:
        if path.read_text().strip() == str(os.getpid()):
            path.unlink()
    except OSError:
        pass
