"""A2A push notifications: the state of a task, POSTed to each of its webhooks when it changes.

**What is sent.** When a run with push configs (its head lists them: the notifier never reads the
log of a run without; of a run with, the facts written since its last look, the whole log once)
changes its A2A state or what it asks its caller (``submitted``,
``working``, ``input-required`` with a new question, ``completed``, ...), each of its configs is
sent the task as ``GetTask`` shows it to its reader, as a ``StreamResponse`` (``{"task": ...}``,
``Content-Type: application/a2a+json``), first when the config is set. The headers:

- ``X-A2A-Notification-Token``: the config's ``token``, when it has one;
- ``Authorization``: the config's ``authentication`` (``scheme credentials``); with the scheme
  ``Bearer`` and no credentials, ``Bearer`` + the signature below (the A2A "JWT + JWKS" flow);
- ``X-A2A-Notification-Signature``: a compact JWS (ES256, :mod:`server.a2a.push_keys`) over
  ``{"task_id", "config_id", "aud": the webhook URL, "iat", "exp": iat + 300, "jti",
  "request_body_sha256": hex SHA-256 of the exact body}``. A webhook checks it with the key set at
  ``/.well-known/a2a-push-jwks.json`` (the header's ``kid``), then the body's hash.
  ``jti`` is ``<task id>:<run version>:<config id>``: the same for every try of one notification,
  and for a restart's re-delivery of it, so a webhook can drop a duplicate.

**Delivery.** One lane per config sends in order, one notification at a time; a newer state
replaces one not yet delivered (a webhook hears the latest state, never an older one after it).
A connection that fails, a timeout, 408, 425, 429 and 5xx are tried again after an exponential
backoff with full jitter (:data:`FIRST_RETRY_SECONDS` doubling up to :data:`MAX_RETRY_SECONDS`, or
the answer's ``Retry-After``), :data:`MAX_ATTEMPTS` tries in all (about five minutes); other
answers are final. The POST itself is :func:`orchestration.workers.post_notification`.

**At least once, across restarts.** What was delivered is known in memory only. At startup the
notifier sends again the current state of every run with push configs that has not ended, or
ended less than ``[a2a] push_resend_window_seconds`` ago: a notification that a killed server had
not delivered is delivered then, and a webhook may see a state twice (the same ``jti``). Nothing
is written to a run for a delivery (an ended run's log takes nothing more). A run another server
process writes to is notified by that process (each serves the same configs with the same key).
The startup scan reads the heads of all runs once, page by page.

**Secrets.** The token and credentials are opened from their sealed form only to be sent; no log
line names them (nor a webhook's path or query: its origin only).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import anyio
from anyio.abc import TaskGroup, TaskStatus

from orchestration.core import PushConfigDeleted, PushConfigured, RunHead
from orchestration.engine import Runtime
from orchestration.errors import ConstructError
from orchestration.workers import Posted, post_notification, webhook_client
from server.a2a.push_keys import PushKeys, SealBroken, seal_context

log = logging.getLogger("construct.a2a.push")

#: tries of one notification at most, and the backoff between them (full jitter: a delay drawn
#: between 0 and the doubled bound)
MAX_ATTEMPTS = 10
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0
#: how long a signature is good for
SIGNATURE_SECONDS = 300
#: the heads read per page of the startup scan
_SCAN_PAGE = 200
#: how many ended runs the notifier remembers having looked at (an older one looked at again is
#: sent its last state again: a duplicate, which at-least-once allows)
_ENDED_KEPT = 10_000
CONTENT_TYPE = "application/a2a+json"


@dataclass(frozen=True, slots=True)
class Notice:
    """One state of a task as its webhooks receive it."""

    run_id: str
    version: int
    #: what a webhook is told again only when it changes: the A2A state and the questions asked
    key: str
    body: bytes


#: one POST: (url, body, headers) -> how it went
Post = Callable[[str, bytes, Mapping[str, str]], Awaitable[Posted]]
#: the notice of a run's head (the task as ``GetTask`` shows it), made by the wire
#: (:func:`server.a2a.sdk_face.push_notice`)
Render = Callable[[RunHead], Awaitable[Notice]]


@dataclass(eq=False)
class _Lane:
    """The deliveries to one config of one run."""

    config: PushConfigured
    pending: Notice | None = None
    sent_key: str | None = None
    #: deleted or replaced: nothing more is sent
    closed: bool = False
    #: the run ended: the lane ends once it delivered what it holds
    last: bool = False
    ready: anyio.Event = field(default_factory=anyio.Event)

    def close(self) -> None:
        self.closed = True
        self.ready.set()


@dataclass(eq=False)
class _Watched:
    """A run with push configs: its configs as of its fact ``loaded_seq``, and their lanes."""

    loaded_seq: int = 0
    configs: dict[str, PushConfigured] = field(default_factory=dict)
    lanes: dict[str, _Lane] = field(default_factory=dict)


def backoff_delay(attempt: int, rng: random.Random, retry_after: float | None) -> float:
    """The wait before try ``attempt + 1``: the webhook's ``Retry-After`` when it gave one, else
    a full-jitter exponential delay."""
    if retry_after is not None:
        return retry_after
    bound = min(MAX_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2 ** (attempt - 1))
    return rng.uniform(0, bound)


class PushNotifier:
    """The notifications of one server process (see the module docstring). :meth:`run` in the
    server's task group; :meth:`changed` is the runtime's listener."""

    def __init__(
        self,
        runtime: Runtime,
        keys: PushKeys,
        render: Render,
        resend_window_seconds: float,
        rng: random.Random | None = None,
        post: Post | None = None,
    ) -> None:
        self._runtime = runtime
        self._keys = keys
        self._render = render
        self._resend_window = timedelta(seconds=resend_window_seconds)
        self._rng = rng or random.Random()
        #: the POST of one notification (a test's fake, else :func:`post_notification` on a pooled
        #: client of the notifier's own)
        self._http = webhook_client() if post is None else None
        self._post_one = post or self._post_http
        #: the runs changed and not yet looked at (newest head of each)
        self._dirty: dict[str, RunHead] = {}
        self._woken = anyio.Event()
        self._runs: dict[str, _Watched] = {}
        #: the runs that ended since this process started (the newest, in the order they ended)
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._tg: TaskGroup | None = None

    async def changed(self, head: RunHead) -> None:
        """The runtime's listener: note the run (no I/O: it runs in the writer's path)."""
        if head.push_configs or head.run_id in self._runs:
            seen = self._dirty.get(head.run_id)
            if seen is None or seen.version < head.version:
                self._dirty[head.run_id] = head
            self._woken.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Send notifications until cancelled; first, the startup scan (in the background)."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                tg.start_soon(self._scan)
                while True:
                    await self._woken.wait()
                    self._woken = anyio.Event()
                    dirty, self._dirty = self._dirty, {}
                    for head in dirty.values():
                        await self._look_at(head)
        finally:
            if self._http is not None:
                with anyio.CancelScope(shield=True):
                    await self._http.aclose()

    async def _scan(self) -> None:
        """Note every run whose last state a killed process may not have delivered."""
        since = self._runtime.clock.now() - self._resend_window
        cursor: str | None = None
        noted = 0
        try:
            while True:
                page = await self._runtime.list_runs(None, _SCAN_PAGE, cursor)
                for head in page.runs:
                    if not head.push_configs:
                        continue
                    if head.status.is_terminal and (head.finished_at or head.updated_at) < since:
                        continue
                    noted += 1
                    await self.changed(head)
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        except ConstructError as exc:
            log.warning(
                "push notifications not resent at startup: %s", exc, extra={"action": "push_scan_failed"}
            )
            return
        log.info(
            "push notifications: the state of %d task(s) is sent again",
            noted,
            extra={"action": "push_resend"},
        )

    async def _look_at(self, noted: RunHead) -> None:
        """Bring the run's lanes to its configs in force, and hand them its state when it changed.
        The head is read again (a noted one may be older than one already looked at: a lane is never
        handed an older state after a newer one); the configs from the facts written since the last
        look (the whole log once). A run that ended is looked at once."""
        if noted.run_id in self._finished:
            return
        try:
            head = await self._runtime.status(noted.run_id)
        except ConstructError as exc:
            log.warning(
                "push notification of task %s not made: %s",
                noted.run_id,
                exc,
                extra={"action": "push_render_failed", "run_id": noted.run_id},
            )
            return
        if not head.push_configs and head.run_id not in self._runs:
            return
        watched = self._runs.setdefault(head.run_id, _Watched())
        try:
            if head.push_configs and head.last_seq > watched.loaded_seq:
                await self._read_configs(watched, head.run_id)
            notice = await self._render(head) if head.push_configs else None
        except ConstructError as exc:
            log.warning(
                "push notification of task %s not made: %s",
                head.run_id,
                exc,
                extra={"action": "push_render_failed", "run_id": head.run_id},
            )
            return
        self._reconcile(watched, head)
        if notice is not None:
            for lane in watched.lanes.values():
                if lane.sent_key != notice.key:
                    lane.pending = notice
                    lane.ready.set()
        if head.status.is_terminal or not head.push_configs:
            for lane in watched.lanes.values():
                lane.last = True
                lane.ready.set()
            del self._runs[head.run_id]
        if head.status.is_terminal:
            self._finished[head.run_id] = None
            if len(self._finished) > _ENDED_KEPT:
                self._finished.popitem(last=False)

    async def _read_configs(self, watched: _Watched, run_id: str) -> None:
        """The run's configs, from the facts written after ``watched.loaded_seq``."""
        for fact in await self._runtime.read_facts(run_id, watched.loaded_seq):
            if isinstance(fact, PushConfigured):
                watched.configs[fact.config_id] = fact
            elif isinstance(fact, PushConfigDeleted):
                watched.configs.pop(fact.config_id, None)
            watched.loaded_seq = max(watched.loaded_seq, fact.seq)

    def _reconcile(self, watched: _Watched, head: RunHead) -> None:
        """A lane for each config in force: a deleted or replaced config's lane closed (nothing
        more is sent to it), a new config's started."""
        for config_id, lane in list(watched.lanes.items()):
            config = watched.configs.get(config_id)
            if config_id not in head.push_configs or config is None or config.seq != lane.config.seq:
                watched.lanes.pop(config_id).close()
        for config_id in head.push_configs:
            config = watched.configs.get(config_id)
            if config is not None and config_id not in watched.lanes:
                lane = watched.lanes[config_id] = _Lane(config)
                assert self._tg is not None
                self._tg.start_soon(self._deliver, head.run_id, lane)

    async def _deliver(self, run_id: str, lane: _Lane) -> None:
        """Send the lane's newest notice, then wait for the next, until the lane is closed (or its
        run ended and it has nothing left)."""
        while not lane.closed:
            notice = lane.pending
            if notice is None:
                if lane.last:
                    return
                await lane.ready.wait()
                lane.ready = anyio.Event()
                continue
            await self._send(run_id, lane, notice)

    async def _send(self, run_id: str, lane: _Lane, notice: Notice) -> None:
        """Try ``notice`` until delivered, refused, out of tries, or superseded by a newer one."""
        attempt = 0
        while not lane.closed:
            attempt += 1
            posted = await self._post(run_id, lane.config, notice)
            if not posted.retry or attempt >= MAX_ATTEMPTS:
                self._ended(run_id, lane.config, notice, posted, attempt)
                if posted.delivered:
                    lane.sent_key = notice.key
                if lane.pending is notice:
                    lane.pending = None
                return
            delay = backoff_delay(attempt, self._rng, posted.retry_after)
            log.info(
                "push notification of task %s to %s not delivered (%s); try %d in %.1f s",
                run_id,
                lane.config.origin,
                posted.what,
                attempt + 1,
                delay,
                extra={"action": "push_retry", "run_id": run_id, "config_id": lane.config.config_id},
            )
            await anyio.sleep(delay)
            if lane.pending is not notice:
                return  # a newer state (or none: delivered meanwhile): the lane sends that, tries anew

    def _ended(
        self, run_id: str, config: PushConfigured, notice: Notice, posted: Posted, attempts: int
    ) -> None:
        extra = {"run_id": run_id, "config_id": config.config_id, "status": posted.status}
        if posted.delivered:
            log.info(
                "push notification of task %s (%s) delivered to %s",
                run_id,
                notice.key,
                config.origin,
                extra={"action": "push_delivered", **extra},
            )
        else:
            log.warning(
                "push notification of task %s (%s) to %s given up after %d tr%s: %s",
                run_id,
                notice.key,
                config.origin,
                attempts,
                "y" if attempts == 1 else "ies",
                posted.what,
                extra={"action": "push_given_up", **extra},
            )

    async def _post(self, run_id: str, config: PushConfigured, notice: Notice) -> Posted:
        return await self._post_one(config.url, notice.body, self._headers(run_id, config, notice))

    async def _post_http(self, url: str, body: bytes, headers: Mapping[str, str]) -> Posted:
        assert self._http is not None
        return await post_notification(self._http, url, body, headers)

    def _headers(self, run_id: str, config: PushConfigured, notice: Notice) -> dict[str, str]:
        now = int(time.time())
        claims = {
            "task_id": run_id,
            "config_id": config.config_id,
            "aud": config.url,
            "iat": now,
            "exp": now + SIGNATURE_SECONDS,
            "jti": f"{run_id}:{notice.version}:{config.config_id}",
            "request_body_sha256": hashlib.sha256(notice.body).hexdigest(),
        }
        signature = self._keys.sign(claims)
        headers = {"Content-Type": CONTENT_TYPE, "X-A2A-Notification-Signature": signature}
        token = self._opened(run_id, config, config.sealed_token, "token")
        if token:
            headers["X-A2A-Notification-Token"] = token
        if config.auth_scheme:
            credentials = self._opened(run_id, config, config.sealed_credentials, "credentials")
            if credentials:
                headers["Authorization"] = f"{config.auth_scheme} {credentials}"
            elif config.auth_scheme.lower() == "bearer":
                headers["Authorization"] = f"Bearer {signature}"
        return headers

    def _opened(self, run_id: str, config: PushConfigured, sealed: str | None, name: str) -> str | None:
        if sealed is None:
            return None
        try:
            return self._keys.open(sealed, seal_context(run_id, config.config_id, name))
        except SealBroken:
            log.warning(
                "push notification config %s of task %s: its %s does not open with this server's key "
                "(another key sealed it); sent without it",
                config.config_id,
                run_id,
                name,
                extra={"action": "push_seal_broken", "run_id": run_id},
            )
            return None
