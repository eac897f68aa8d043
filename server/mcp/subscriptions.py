"""Announcing changes that *other* processes make to runs someone subscribed to here (this process
announces its own writes at once): :class:`RunSubscriptions` polls the store for the subscribed runs
only, every ``poll_seconds``, so a subscriber hears of such a change within about one interval.

Subscriptions are bounded (only runs are kept, at most ``max_subscriptions`` per session, each ended
with its session or stream), and an update reaches only the callers that may read the run
(:meth:`~server.identity.Caller.may_read`), checked again at each update.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourceUpdated,
    ServerEvent,
)
from mcp.shared.exceptions import MCPError

from orchestration.core import RunHead, validate_run_id
from orchestration.errors import ConstructError, InvalidArgument, RunNotFound
from server.identity import Caller, caller_of
from server.mcp.tool_hints import tool_error_text
from server.sdk import connection_of, on_connection_closed

log = logging.getLogger("construct.server")

RUN_URI_PREFIX = "run://"

#: The default cap on one session's subscriptions (``CONSTRUCT_MAX_SUBSCRIPTIONS``).
DEFAULT_MAX_SUBSCRIPTIONS = 100

LoadHead = Callable[[str], Awaitable[RunHead]]
Publish = Callable[[RunHead], Awaitable[None]]


class TooManySubscriptions(ConstructError):
    """A session asked for more subscriptions than ``max_subscriptions``."""

    code = "too_many_subscriptions"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"a session may hold at most {limit} resource subscriptions (CONSTRUCT_MAX_SUBSCRIPTIONS); "
            "unsubscribe from runs you no longer follow (finished runs change no more)"
        )


def run_id_of(uri: str) -> str | None:
    """The run id of a ``run://<id>`` URI with a valid id, else None."""
    if not uri.startswith(RUN_URI_PREFIX):
        return None
    run_id = uri[len(RUN_URI_PREFIX) :]
    try:
        validate_run_id(run_id)
    except ConstructError:
        return None
    return run_id


def check_subscribable(uri: str) -> bool:
    """True when ``uri`` is a run to watch (``run://<a valid run id>``); False for a URI of another
    scheme, which is acknowledged and not kept: it names nothing of this server that can change,
    and generic clients subscribe to such URIs (the MCP conformance suite to
    ``test://watched-resource``). Raises
    :class:`InvalidArgument` for a ``run://`` URI whose id is not a valid run id."""
    if not uri.startswith(RUN_URI_PREFIX):
        return False
    if run_id_of(uri) is None:
        shown = uri if len(uri) <= 100 else uri[:100] + "..."
        raise InvalidArgument(
            f"cannot subscribe to {shown!r}: not a valid run resource; subscribe to "
            "'run://<run_id>' with a run id from orchestrate_start or runs_list"
        )
    return True


async def check_subscriber(caller: Caller, uris: Iterable[str], load: LoadHead) -> None:
    """Refuse (``forbidden``) a subscription to ``uris`` (run URIs, checked) that ``caller`` could not
    read: without the ``read`` role, or, for an identity limited to its own runs, a run it did not
    start. A run not stored (yet) is no refusal: its updates are checked as they come."""
    uris = list(uris)
    if not uris:
        return
    caller.require("read", "subscribing to a run resource")
    if not caller.own_runs_only:
        return
    for uri in uris:
        run_id = run_id_of(uri)
        if run_id is None:
            continue
        try:
            head = await load(run_id)
        except RunNotFound:
            continue
        caller.check_run(head)


def as_protocol_error(exc: ConstructError) -> MCPError:
    """A JSON-RPC error (invalid params) whose message starts with the error's stable code."""
    return MCPError(code=types.INVALID_PARAMS, message=tool_error_text(exc))


class LegacySubscribers:
    """Sessions of handshake-era clients (``resources/subscribe``) per resource URI.

    2026-07-28 clients subscribe with ``subscriptions/listen`` and are served by the SDK's
    subscription bus; older clients need a ``notifications/resources/updated`` sent on their own
    session, so we remember which connection asked for which URI.

    Entries are keyed by the client's connection (the SDK builds a new ``ServerSession`` for every
    request, but one ``Connection`` per client), are dropped when that connection closes, and are
    capped at ``max_per_session`` per connection (``CONSTRUCT_MAX_SUBSCRIPTIONS``)."""

    def __init__(self, max_per_session: int = DEFAULT_MAX_SUBSCRIPTIONS) -> None:
        self.max_per_session = max_per_session
        #: uri -> connection -> the latest session object of that connection (it sends the updates)
        #: and the caller that subscribed (an update goes only to a caller who may read the run)
        self.by_uri: dict[str, dict[object, tuple[ServerSession, Caller]]] = {}
        #: connection -> the URIs it subscribed to
        self._by_connection: dict[object, set[str]] = {}

    def add(self, uri: str, session: ServerSession, caller: Caller) -> None:
        """Subscribe ``session``'s connection, for ``caller``, to ``uri``. Idempotent. Raises
        InvalidArgument for a URI that is not a valid run's, TooManySubscriptions over the cap."""
        if not check_subscribable(uri):
            log.debug(
                "subscription to a non-run resource acknowledged, not kept",
                extra={"action": "subscribe_ignored"},
            )
            return
        key = connection_of(session)
        uris = self._by_connection.get(key)
        if uris is None:
            uris = self._by_connection[key] = set()
            self._on_close(key, session)
        if uri not in uris and len(uris) >= self.max_per_session:
            raise TooManySubscriptions(self.max_per_session)
        uris.add(uri)
        self.by_uri.setdefault(uri, {})[key] = (session, caller)

    def remove(self, uri: str, session: ServerSession) -> None:
        """Unsubscribe ``session``'s connection from ``uri`` (nothing if it was not subscribed)."""
        self._discard(uri, connection_of(session))

    def drop(self, connection: object) -> None:
        """Forget every subscription of ``connection`` (it closed)."""
        uris = self._by_connection.pop(connection, set())
        for uri in uris:
            self._discard(uri, connection)
        if uris:
            log.info(
                "a session ended: dropped its %d resource subscription(s)",
                len(uris),
                extra={"action": "subscriptions_dropped"},
            )

    def count(self) -> int:
        """How many (connection, URI) subscriptions are held."""
        return sum(len(uris) for uris in self._by_connection.values())

    async def notify(self, uri: str, head: RunHead) -> None:
        """Send ``notifications/resources/updated`` for ``uri`` (``head``'s run) to each session
        subscribed to it whose caller may read the run."""
        for key, (session, caller) in list(self.by_uri.get(uri, {}).items()):
            if not caller.may_read(head):
                continue
            try:
                await session.send_resource_updated(uri)
            except Exception as exc:
                # The client went away: forget it rather than fail the write that triggered this.
                log.info(
                    "dropping a resource subscriber: %s",
                    type(exc).__name__,
                    extra={"action": "subscriber_dropped"},
                )
                self._discard(uri, key)

    def _discard(self, uri: str, key: object) -> None:
        sessions = self.by_uri.get(uri)
        if sessions is not None:
            sessions.pop(key, None)
            if not sessions:
                del self.by_uri[uri]
        uris = self._by_connection.get(key)
        if uris is not None:
            uris.discard(uri)

    def _on_close(self, key: object, session: ServerSession) -> None:
        if not on_connection_closed(session, lambda: self.drop(key)):  # pragma: no cover - see server.sdk
            log.warning(
                "resource subscriptions cannot be tied to their session; they end when a notification "
                "to it fails",
                extra={"action": "subscriptions_untied"},
            )


class RunEventBus:
    """The ``subscriptions/listen`` fan-out, keyed by caller (the SDK's ``SubscriptionBus`` seam).

    Each caller (a token's identity, or a local caller) has its own in-memory bus and its own SDK
    listen handler (:meth:`listen_handler`), so a listen stream only ever receives what was
    published to its caller's bus. A run's update is published with :meth:`publish_run`, to the
    buses of the callers that may read the run (:meth:`~server.identity.Caller.may_read`); an
    event about no run (a list changed) published through the seam (:meth:`publish`) reaches every
    caller, and an update of a run published there, without its head, reaches nobody. Callers are
    the configured identities and the local ones: a bounded set."""

    def __init__(self) -> None:
        self._buses: dict[Caller, InMemorySubscriptionBus] = {}
        self._handlers: dict[Caller, ListenHandler] = {}
        self._everyone = InMemorySubscriptionBus()

    def bus_for(self, caller: Caller) -> InMemorySubscriptionBus:
        """``caller``'s own bus: what its listen streams receive."""
        bus = self._buses.get(caller)
        if bus is None:
            bus = self._buses[caller] = InMemorySubscriptionBus()
        return bus

    def listen_handler(self, caller: Caller) -> ListenHandler:
        """The SDK's listen handler serving ``caller``'s streams, over ``caller``'s bus."""
        handler = self._handlers.get(caller)
        if handler is None:
            handler = self._handlers[caller] = ListenHandler(self.bus_for(caller))
        return handler

    async def publish_run(self, head: RunHead) -> None:
        """Announce that ``head``'s run changed to the callers that may read it."""
        event = ResourceUpdated(uri=RUN_URI_PREFIX + head.run_id)
        for caller, bus in list(self._buses.items()):
            if caller.may_read(head):
                await bus.publish(event)

    async def publish(self, event: ServerEvent) -> None:
        """``SubscriptionBus.publish``: an event about no run, to every caller (see the class)."""
        if isinstance(event, ResourceUpdated) and event.uri.startswith(RUN_URI_PREFIX):
            log.debug("a run update without its run is not announced", extra={"action": "update_dropped"})
            return
        for bus in [self._everyone, *self._buses.values()]:
            await bus.publish(event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        """``SubscriptionBus.subscribe``: a listener of the events :meth:`publish` carries."""
        return self._everyone.subscribe(listener)


class RunSubscriptions:
    """The run resources this process has subscribers for, and the version each was last announced
    at. ``load`` reads a run's head from the store; ``legacy_uris`` lists the URIs handshake-era
    sessions subscribed to (they are kept by :class:`LegacySubscribers`)."""

    def __init__(self, legacy_uris: Callable[[], Iterable[str]]) -> None:
        self._legacy_uris = legacy_uris
        self._listening: Counter[str] = Counter()
        self._announced: dict[str, int] = {}
        #: watched runs seen terminal: never read again
        self._ended: set[str] = set()
        self._load: LoadHead | None = None

    def attach(self, load: LoadHead) -> None:
        """Give the store reader (the runtime exists only once the server runs)."""
        self._load = load

    async def load(self, run_id: str) -> RunHead:
        """The run's head, from the store (``run_not_found`` before the server runs)."""
        if self._load is None:
            raise RunNotFound(run_id)
        return await self._load(run_id)

    def watched(self) -> set[str]:
        """Run ids with at least one subscriber here."""
        uris = set(self._listening) | set(self._legacy_uris())
        return {run_id for uri in uris if (run_id := run_id_of(uri)) is not None}

    async def add(self, uris: Iterable[str], *, listening: bool) -> None:
        """A subscription to ``uris`` begins: remember each run's current version, so that only
        later changes are announced. ``listening``: a listen stream (counted; see :meth:`remove`)."""
        for uri in uris:
            run_id = run_id_of(uri)
            if run_id is None:
                continue
            if listening:
                self._listening[uri] += 1
            if run_id not in self._announced:
                self._announced[run_id] = await self._version(run_id)

    def remove(self, uris: Iterable[str]) -> None:
        """A listen stream over ``uris`` ended."""
        for uri in uris:
            if self._listening[uri] > 1:
                self._listening[uri] -= 1
            else:
                self._listening.pop(uri, None)

    def announced(self, head: RunHead) -> None:
        """``head`` has just been announced (this process wrote it). Only watched runs are kept."""
        last = self._announced.get(head.run_id)
        if last is not None and head.version > last:
            self._announced[head.run_id] = head.version

    async def changed(self) -> list[RunHead]:
        """The watched runs whose stored version is past the one last announced (each marked as
        announced). Runs nobody watches any more are forgotten."""
        watched = self.watched()
        for run_id in [r for r in self._announced if r not in watched]:
            del self._announced[run_id]
        self._ended &= watched
        out: list[RunHead] = []
        for run_id in sorted(watched - self._ended):
            head = await self._head(run_id)
            if head is None:
                continue
            last = self._announced.get(run_id)
            self._announced[run_id] = max(head.version, last or 0)
            if last is not None and head.version > last:
                out.append(head)
            if head.status.is_terminal:
                self._ended.add(run_id)  # nothing is ever written after a terminal fact
        return out

    async def run(
        self,
        publish: Publish,
        poll_seconds: float,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Poll the watched runs and ``publish`` those another process changed, until cancelled."""
        task_status.started()
        while True:
            await anyio.sleep(poll_seconds)
            for head in await self.changed():
                await publish(head)

    async def _version(self, run_id: str) -> int:
        head = await self._head(run_id)
        return 0 if head is None else head.version

    async def _head(self, run_id: str) -> RunHead | None:
        if self._load is None:
            return None
        try:
            return await self._load(run_id)
        except ConstructError as exc:
            # Not found (yet), unreadable, or the store is down: nothing to announce now.
            log.debug("watched run %s not read: %s", run_id, exc, extra={"run_id": run_id})
            return None


def watching_listen_handler(
    bus: RunEventBus,
    subscriptions: RunSubscriptions,
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
) -> Callable[[ServerRequestContext[Any, Any], types.SubscriptionsListenRequestParams], Awaitable[Any]]:
    """The SDK's ``subscriptions/listen`` handler of the caller (:meth:`RunEventBus.listen_handler`),
    telling ``subscriptions`` which run resources the stream covers while it is open. A stream names
    at most ``max_subscriptions`` resources, each ``run://<run id>`` (else a JSON-RPC error whose
    message starts with the code); naming any is checked like reading them (:func:`check_subscriber`)."""

    async def handle(
        ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        named = [str(uri) for uri in params.notifications.resource_subscriptions or ()]
        try:
            uris = [uri for uri in named if check_subscribable(uri)]
            caller = caller_of(ctx.request)
            if len(set(uris)) > max_subscriptions:
                caller.require("read", "subscribing to a run resource")
                raise TooManySubscriptions(max_subscriptions)
            await check_subscriber(caller, uris, subscriptions.load)
        except ConstructError as exc:
            raise as_protocol_error(exc) from None
        await subscriptions.add(uris, listening=True)
        try:
            return await bus.listen_handler(caller)(ctx, params)
        finally:
            subscriptions.remove(uris)

    return handle
