"""The composition root: the one place that builds real objects and wires them together.

:class:`ConstructApp` validates the settings and the catalog before anything starts and opens the
store before any transport does, so a bad config or an unusable store is a clean startup error.
Whatever stops the server, shutdown is the same: no new work, the write in progress completes, runs
still driven after :data:`SHUTDOWN_GRACE_SECONDS` are cancelled, and every lease is released, so
another process takes the runs over at once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import anyio
import mcp_types
import uvicorn
from anyio.abc import TaskGroup
from mcp.server import MCPServer
from mcp.server.request_state import RequestStateSecurity
from starlette.types import ASGIApp

from orchestration.chains import Catalog
from orchestration.core import RunHead
from orchestration.engine import Dispatcher, Runtime
from orchestration.errors import ConfigError, ConstructError
from orchestration.ops import at_startup
from server.a2a.chain_agent import ChainAgent
from server.a2a.push_keys import PushKeyError, PushKeys
from server.a2a.push_notifier import PushNotifier
from server.collector import tune_collector
from server.mcp.arguments import UnknownToolRefusal
from server.mcp.chain_prompts import PromptRefusal, register_chain_prompts
from server.mcp.elicit import STATE_TTL_SECONDS
from server.mcp.protocol_errors import CodedErrors
from server.mcp.publishing import build_tools
from server.mcp.resources import register_resources
from server.mcp.server_card import SERVER_NAME, SERVER_TITLE, instructions_with, server_version
from server.mcp.services import Services
from server.mcp.shown_runs import ShownRuns
from server.mcp.subscriptions import LegacySubscribers, RunEventBus, RunSubscriptions, watching_listen_handler
from server.mcp.tasks import TasksExtension, guard_task_notifications
from server.sdk import set_request_handler
from server.settings.config import Settings
from server.settings.providers import missing_key_warning
from server.settings.storage import OpenedRunStore, open_run_store
from server.settings.telemetry import configure_tracing
from server.transports.auth import BearerTokenMiddleware, RedactQueryStrings, check_exposure
from server.transports.http import (
    BodyLimitMiddleware,
    bind_host,
    max_message_bytes,
    sse_app,
    streamable_http_app,
)
from server.transports.resource_server import OAuthResource, WithResourceMetadata
from server.transports.stdio import serve_stdio
from server.transports.uvicorn_adapter import GracefulServer
from server.views.chain_behind import ChainNews
from server.views.parts import check_room
from server.web.pages import with_run_pages
from server.web.panel import panel_extension
from server.web.sign_in import page_sign_in
from server.wiring import runtime_for

log = logging.getLogger("construct.server")

Transport = Literal["stdio", "sse", "streamable-http"]

#: How long shutdown waits for runs being driven to reach a step boundary before cancelling them.
#: Short on purpose: the MCP SDK's stdio client sends SIGTERM 2 s after closing a server's stdin and
#: SIGKILL 2 s after that, and a killed server leaves its leases to expire instead of releasing them.
#: A provider call still running after this is abandoned; the next worker retries it (marked as a
#: possible duplicate call).
SHUTDOWN_GRACE_SECONDS = 1.0

#: On SIGTERM/SIGINT, how long the HTTP transports wait for open requests and streams before
#: cancelling them. Without a bound, one client waiting on a call (``wait_seconds`` up to 300 s) or
#: holding an SSE stream open keeps the server from ever reaching its lifespan's shutdown.
HTTP_SHUTDOWN_TIMEOUT_SECONDS = 3


def instructions_for(settings: Settings) -> str:
    """The ``instructions`` a host receives when it connects:
    :data:`~server.mcp.server_card.INSTRUCTIONS`, and a warning a model must know before it starts a
    run (a provider backend without a key)."""
    return instructions_with(missing_key_warning(settings))


class ConstructApp:
    """Settings + catalog, and the server built from them. One per process."""

    def __init__(self, settings: Settings, catalog: Catalog | None = None) -> None:
        self.settings = settings
        # Loaded here, not in the lifespan: a bad [specialists]/[chains] table must stop the
        # process before it answers anything.
        self.catalog = catalog if catalog is not None else Catalog.load(settings.config_file)
        check_room(self.catalog, settings.max_answer_chars)
        self._services: Services | None = None
        # Resource-change fan-out, to the callers who may read the run: 2026-07-28 listeners (one
        # bus per caller) and handshake-era sessions.
        self._bus = RunEventBus()
        self._legacy = LegacySubscribers(settings.max_subscriptions)
        # Which runs have subscribers here, so that changes other processes write are announced too.
        self._subscriptions = RunSubscriptions(lambda: list(self._legacy.by_uri))
        # The store serve_async opened before starting a transport (the lifespan then uses it).
        self._opened: OpenedRunStore | None = None
        # The [auth] issuer's resource server, when one is configured (HTTP only).
        self._oauth = OAuthResource(settings.auth) if settings.auth.enabled else None
        # The A2A push notifier, made with the A2A app when push notifications are offered (HTTP
        # only) and run by the lifespan.
        self._notifier: Callable[[Runtime], PushNotifier] | None = None

    def build_server(self) -> MCPServer[Services]:
        limits = self.settings.limits()
        tools = build_tools(limits)
        panel = panel_extension(tools)  # the run panel (MCP Apps): marks two of the tools
        server: MCPServer[Services] = MCPServer(
            SERVER_NAME,
            title=SERVER_TITLE,
            instructions=instructions_for(self.settings),
            version=server_version(),
            lifespan=self.lifespan,
            subscriptions=self._bus,
            log_level=self.settings.log_level,
            tools=tools,
            middleware=[CodedErrors(), UnknownToolRefusal(tools), PromptRefusal(self.catalog, limits)],
            # MCP Tasks for clients that declare them (see server.mcp.tasks)
            extensions=[panel, TasksExtension()],
            # The SDK seals every request_state (the gate forms' too, see server.mcp.elicit) under a
            # key of this process; stated here so that the forms' expiry is this server's.
            request_state_security=RequestStateSecurity.ephemeral(ttl=STATE_TTL_SECONDS),
        )
        register_resources(server, self._legacy, self._subscriptions)
        register_chain_prompts(server, self.catalog)
        # The SDK's listen handler, told which run resources each open stream covers (and refusing
        # task notifications to a client that did not declare MCP Tasks, see server.mcp.tasks).
        set_request_handler(
            server,
            "subscriptions/listen",
            mcp_types.SubscriptionsListenRequestParams,
            guard_task_notifications(
                watching_listen_handler(self._bus, self._subscriptions, self.settings.max_subscriptions)
            ),
        )
        return server

    def _warnings(self, opened: OpenedRunStore) -> tuple[str, ...]:
        """What the log warns of at startup: the store's (a fallback, also in every run view) and a
        provider backend without a key (also in the ``instructions``: not in every run view, where
        an inline run would carry it for nothing)."""
        key = missing_key_warning(self.settings)
        return (*opened.warnings, *([key] if key is not None else []))

    @asynccontextmanager
    async def lifespan(self, _server: MCPServer[Services]) -> AsyncIterator[Services]:
        if self._services is not None:
            # SSE enters the lifespan once per connection: share the process's services.
            yield self._services
            return
        owned = self._opened is None
        opened = self._opened if self._opened is not None else await open_run_store(self.settings)
        memory = ShownRuns(self.settings.max_answer_chars)
        try:
            async with (
                runtime_for(self.settings, opened.store, self.catalog, opened.warnings, memory) as runtime,
                self._running(opened, runtime, memory) as services,
            ):
                yield services
        finally:
            if owned:
                await _close_store(opened)

    @asynccontextmanager
    async def _running(
        self, opened: OpenedRunStore, runtime: Runtime, memory: ShownRuns
    ) -> AsyncIterator[Services]:
        settings = self.settings
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
            memory=memory,
            chain_news=ChainNews(runtime.catalog, runtime.versions),
        )
        subscriptions = self._subscriptions
        subscriptions.attach(runtime.status)

        async def announce(head: RunHead) -> None:
            subscriptions.announced(head)
            await services.publish_change(head)

        runtime.add_listener(announce)
        for warning in self._warnings(opened):
            log.warning(warning, extra={"action": "startup_warning"})
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run)
            await tg.start(subscriptions.run, services.publish_change, settings.poll_seconds)
            tg.start_soon(_report_behind, runtime)
            self._services = services
            await self._notify(tg, runtime)  # after the services: it renders tasks with them
            _write_pid_file(settings.pid_file)
            log.info(
                "server started: %s",
                " ".join(f"{k}={v}" for k, v in services.describe().items()),
                extra={"action": "server_started", "owner": runtime.settings.owner},
            )
            try:
                yield services
            finally:
                self._services = None
                with anyio.CancelScope(shield=True):
                    # Stop taking new work; let runs being driven reach their next step boundary
                    # (the write in progress completes). Whatever still runs after the grace period
                    # is cancelled and recovered later from its facts.
                    dispatcher.stop()
                    with anyio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                        await dispatcher.stopped.wait()
                tg.cancel_scope.cancel()
                _remove_pid_file(settings.pid_file)
                log.info(
                    "server stopping", extra={"action": "server_stopping", "owner": runtime.settings.owner}
                )

    async def _notify(self, tg: TaskGroup, runtime: Runtime) -> None:
        """Start the A2A push notifier in ``tg``, told of every write, when push is offered (a
        write before it is covered by its startup scan, which follows its listening)."""
        if self._notifier is not None:
            notifier = self._notifier(runtime)
            runtime.add_listener(notifier.changed)
            await tg.start(notifier.run)

    # -- transports ------------------------------------------------------------------------------

    def serve(self, transport: Transport = "stdio", host: str = "127.0.0.1", port: int = 8000) -> None:
        """Run the server until it is stopped: stdio by the end of stdin or SIGTERM, HTTP by SIGINT or
        SIGTERM. Every way runs the same orderly shutdown (see the module docstring)."""
        anyio.run(self.serve_async, transport, host, port)

    async def serve_async(
        self, transport: Transport = "stdio", host: str = "127.0.0.1", port: int = 8000
    ) -> None:
        if transport != "stdio":
            check_exposure(host, self.settings.named_tokens(), issuer=self._oauth is not None)
            if self._oauth is not None and self.settings.auth.introspection_client_id is not None:
                self._oauth.introspect_with(self.settings.introspection_secret())
            host = bind_host(host)  # "[::1]" binds as "::1"
        # Spans are exported only when the otel extra and OTEL_* ask for it (server.settings.telemetry).
        stop_tracing = configure_tracing(self.settings.otel)
        server = self.build_server()
        # Open the store before any transport starts: an unreachable store (with store_fallback
        # off) is then a one-line startup error, not a traceback from inside the transport.
        self._opened = await open_run_store(self.settings)
        tune_collector()  # startup is done: what it made lives as long as the process
        try:
            await self._serve_transport(server, transport, host, port)
        finally:
            opened, self._opened = self._opened, None
            await _close_store(opened)
            stop_tracing()

    async def _serve_transport(
        self, server: MCPServer[Services], transport: Transport, host: str, port: int
    ) -> None:
        log.info("serving", extra={"action": "serve", "transport": transport})
        max_bytes = max_message_bytes(self.settings.limits())
        if transport == "stdio":
            # SIGTERM ends the input, so it stops the server the way the end of stdin does.
            await serve_stdio(server, max_bytes)
        elif transport == "streamable-http":
            # The session manager enters the lifespan once, for the life of the ASGI app.
            app = streamable_http_app(
                server,
                host=host,
                max_body_bytes=max_bytes,
                max_sessions=self.settings.http_max_sessions,
                idle_seconds=self.settings.http_session_idle_seconds,
            )
            # ... and the run pages for a browser at /runs (see server.web.pages).
            app = with_run_pages(
                self._guarded(app),
                lambda: self._services,
                self.settings.named_tokens(),
                host,
                max_bytes,
                self._oauth,
                page_sign_in(self._oauth, self.settings.page_secret()),
            )
            app = self._with_a2a(app, host, max_bytes)
            if self._oauth is not None:
                app = WithResourceMetadata(app, self._oauth)
            base = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
            log.info(
                f"MCP at {base}/mcp; the runs page at {base}/runs; "
                f"the A2A agent card at {base}/.well-known/agent-card.json",
                extra={"action": "http_addresses", "transport": transport},
            )
            await _serve_http(app, host, port, self.settings.log_level, self._stop_work)
        elif transport == "sse":
            # The SSE app enters the lifespan per connection; hold it for the whole process so the
            # store and dispatcher live (and recover runs) even before the first client connects.
            async with self.lifespan(server):
                sse: ASGIApp = self._guarded(sse_app(server, host=host, max_body_bytes=max_bytes))
                await _serve_http(
                    sse if self._oauth is None else WithResourceMetadata(sse, self._oauth),
                    host,
                    port,
                    self.settings.log_level,
                    self._stop_work,
                )
        else:  # pragma: no cover - the CLI restricts the choices
            raise ValueError(f"unknown transport {transport!r}")

    def _with_a2a(self, app: ASGIApp, host: str, max_bytes: int) -> ASGIApp:
        """``app`` with every chain served as an A2A agent beside it (``/a2a`` and its agent card:
        :mod:`server.a2a.sdk_face`), when the ``a2a`` extra is installed."""
        try:
            from server.a2a.sdk_face import WithA2A, a2a_app
        except ImportError:
            log.info("A2A is not served: install construct-mcp[a2a]", extra={"action": "a2a_off"})
            return app
        agent = ChainAgent(lambda: self._services)
        keys = self._push_keys()
        a2a = a2a_app(
            agent,
            self.catalog,
            server_version(),
            bearer=bool(self.settings.named_tokens()) or self._oauth is not None,
            public_url=None if self._oauth is None else self._oauth.audience,
            push_keys=keys,
        )
        if keys is not None:
            from server.a2a.sdk_face import push_notice

            window = self.settings.a2a.push_resend_window_seconds
            self._notifier = lambda runtime: PushNotifier(
                runtime, keys, lambda head: push_notice(agent, head), window
            )
        return WithA2A(app, a2a, lambda rpc: self._guarded(BodyLimitMiddleware(rpc, max_bytes)), host)

    def _push_keys(self) -> PushKeys | None:
        """The key of A2A push notifications (``[a2a]``), or None: not offered (the log says so).
        A key that is not usable stops the server (a config error, never quoting the key)."""
        pem = self.settings.push_signing_key()
        if pem is None:
            log.info(
                "A2A push notifications are not offered: no [a2a] push_signing_key_file or "
                "push_signing_key_env is configured",
                extra={"action": "a2a_push_off"},
            )
            return None
        try:
            keys = PushKeys(pem)
        except PushKeyError as exc:
            raise ConfigError(str(self.settings.config_file), "a2a", str(exc)) from None
        log.info(
            "A2A push notifications are offered, signed with key %s",
            keys.kid,
            extra={"action": "a2a_push_on"},
        )
        return keys

    def _guarded(self, app: ASGIApp) -> ASGIApp:
        """``app`` behind the bearer tokens and the ``[auth]`` issuer's access tokens, when any is
        configured (see :mod:`server.transports.auth`)."""
        tokens = self.settings.named_tokens()
        if not tokens and self._oauth is None:
            return app
        log.info(
            "HTTP requests need a bearer token; identities: %s%s",
            ", ".join(t.identity for t in tokens) or "none configured",
            "" if self._oauth is None else f"; and access tokens of {self._oauth.issuer}",
            extra={"action": "auth_enabled"},
        )
        return BearerTokenMiddleware(app, tokens, self._oauth)

    def _stop_work(self) -> None:
        """At SIGTERM/SIGINT on HTTP, before uvicorn waits for open requests: take no new work, and
        let calls waiting for a run to settle answer now, so the requests end and the lifespan's
        shutdown is reached without cancelling them."""
        if self._services is not None:
            log.info("stopping: no new work", extra={"action": "shutdown_requested"})
            self._services.dispatcher.stop()


async def _serve_http(
    app: ASGIApp, host: str, port: int, log_level: str, on_exit: Callable[[], None] | None = None
) -> None:
    # log_config=None: uvicorn's own config would send access logs to stdout and bypass our
    # one-line stderr format; with None its loggers propagate to the root handler we installed.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        log_level=log_level.lower(),
        timeout_graceful_shutdown=HTTP_SHUTDOWN_TIMEOUT_SECONDS,
    )
    # A query string may carry a token: the access log shows paths without it.
    access = logging.getLogger("uvicorn.access")
    redact = RedactQueryStrings()
    access.addFilter(redact)
    try:
        await GracefulServer(config, on_exit).serve()
    finally:
        access.removeFilter(redact)


async def _close_store(opened: OpenedRunStore) -> None:
    with anyio.CancelScope(shield=True):
        await opened.store.close()
    log.info("store closed", extra={"action": "store_closed"})


async def _report_behind(runtime: Runtime) -> None:
    """Log how many live runs are behind their chain's current version, and how many cannot move,
    having moved those of chains whose runs move by themselves (``at_boundary``)."""
    try:
        found = await at_startup(runtime)
    except ConstructError as exc:
        log.warning("live runs not checked against their chains: %s", exc, extra={"action": "rollout_failed"})
        return
    if found.behind:
        blocked = "; ".join(f"{run_id}: {why}" for run_id, why in list(found.blocked.items())[:3])
        log.warning(
            "%d live run(s) are behind their chain's current version (%s)%s",
            found.behind,
            found.said(),
            f"; cannot move: {blocked}" if blocked else "",
            extra={"action": "runs_behind", "behind": found.behind},
        )


def _write_pid_file(path: Path | None) -> None:
    # CONSTRUCT_PID_FILE: lets the demo and the crash tests find and SIGKILL this very process.
    if path is None:
        return
    # The pid file may live in a home the store has not created yet (or never creates: a database
    # store): make its directory, so a first start in a new home does not fail on it.
    path.parent.mkdir(parents=True, exist_ok=True)
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
