"""Announcing changes that *other* processes make to runs someone subscribed to here.

This process announces its own writes at once (the runtime's listener). A run can also change
through another process on the same store: the CLI (``construct-mcp runs approve``), or another
server that took the run's lease (scale-out on Postgres). :class:`RunSubscriptions` knows which run
resources have subscribers in this process (``subscriptions/listen`` streams and handshake-era
``resources/subscribe`` sessions) and the version each was last announced at; :meth:`run` polls the
store for those runs only, every ``poll_seconds`` (``CONSTRUCT_POLL_SECONDS``, default 1 s), and
announces a run whose stored version went past the last announced one. So a subscriber hears of a
change written elsewhere within about one poll interval, and of a change written here once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler

from orchestration.errors import ConstructError
from orchestration.ids import validate_run_id
from orchestration.models import RunHead

log = logging.getLogger("construct.server")

RUN_URI_PREFIX = "run://"

LoadHead = Callable[[str], Awaitable[RunHead]]
Publish = Callable[[RunHead], Awaitable[None]]


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


class RunSubscriptions:
    """The run resources this process has subscribers for, and the version each was last announced
    at. ``load`` reads a run's head from the store; ``legacy_uris`` lists the URIs handshake-era
    sessions subscribed to (they are kept by :class:`~server.services.LegacySubscribers`)."""

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
    listen: ListenHandler, subscriptions: RunSubscriptions
) -> Callable[[ServerRequestContext[Any, Any], types.SubscriptionsListenRequestParams], Awaitable[Any]]:
    """The SDK's ``subscriptions/listen`` handler, telling ``subscriptions`` which run resources
    the stream covers while it is open."""

    async def handle(
        ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        uris = [str(uri) for uri in params.notifications.resource_subscriptions or ()]
        await subscriptions.add(uris, listening=True)
        try:
            return await listen(ctx, params)
        finally:
            subscriptions.remove(uris)

    return handle
