"""One POST of a notification to a webhook (the A2A face's push notifications; who posts what and
when is :mod:`server.a2a.push_notifier`). Nothing here retries: the answer says whether another
try may succeed (:attr:`Posted.retry`), and the notifier owns the backoff.

An answer is final when it is 2xx (delivered) or another 4xx than 408, 425 and 429 (the webhook
refuses it: sending it again would be refused again); 408, 425, 429 and 5xx, a timeout and a
connection that fails are worth another try, after the answer's ``Retry-After`` (seconds) when it
gives one. Redirects are not followed (a webhook that moved is a config to change). What an answer
says of itself (:attr:`Posted.what`) is its status or the transport's failure: never its body, nor
the request's headers, which carry the client's token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx2

from orchestration.workers._http import map_transport_exception
from orchestration.workers.model_calls import make_http_client

#: how long one POST may take to connect, and to send and be answered (the A2A specification
#: recommends 10-30 seconds)
CONNECT_TIMEOUT_SECONDS = 10.0
ANSWER_TIMEOUT_SECONDS = 15.0
#: the statuses below 500 worth another try
_RETRIED = frozenset({408, 425, 429})
#: the longest ``Retry-After`` heeded (a longer one is cut to it)
MAX_RETRY_AFTER_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Posted:
    """How one POST went."""

    #: the webhook's HTTP status (None: no answer)
    status: int | None
    #: False when delivered or refused for good; True when another try may succeed
    retry: bool
    #: the webhook's ``Retry-After``, in seconds, when it gave one
    retry_after: float | None
    #: what happened, safe for a log line
    what: str

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def webhook_client() -> httpx2.AsyncClient:
    """The pooled client of a server's notifications (close it at shutdown). Proxies of the
    environment are not used: a webhook is reached directly, as its URL was checked."""
    return make_http_client(
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=ANSWER_TIMEOUT_SECONDS,
        write_timeout=ANSWER_TIMEOUT_SECONDS,
        pool_timeout=ANSWER_TIMEOUT_SECONDS,
        max_connections=16,
        trust_env=False,
    )


def _retry_after(headers: httpx2.Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None or not value.strip().isdigit():
        return None  # an HTTP date: the backoff's own delay instead
    return min(float(value.strip()), MAX_RETRY_AFTER_SECONDS)


async def post_notification(
    http: httpx2.AsyncClient, url: str, body: bytes, headers: Mapping[str, str]
) -> Posted:
    """POST ``body`` to ``url`` with ``headers``."""
    try:
        response = await http.post(url, content=body, headers=dict(headers))
    except httpx2.HTTPError as exc:
        _, what, _ = map_transport_exception(exc)
        return Posted(None, True, None, what)
    status = response.status_code
    await response.aclose()
    if 200 <= status < 300:
        return Posted(status, False, None, f"HTTP {status}")
    retry = status >= 500 or status in _RETRIED
    return Posted(status, retry, _retry_after(response.headers) if retry else None, f"HTTP {status}")
