"""The provider-call port: one model call, its typed outcome, and the error taxonomy.

A :class:`ProviderClient` makes exactly one HTTP attempt per :meth:`~ProviderClient.complete`: it
never retries and never sleeps, since the durable step is the only retry layer. Every outcome that
is not a usable text is a :class:`ProviderCallError` whose code is a :class:`ProviderErrorCode`
(the table: docs/providers.md). No key or auth header ever reaches a message, a record or a log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol

import httpx2

from orchestration.core.models import Telemetry, TypedError

__all__ = [
    "RETRYABLE_BY_CODE",
    "SHARD_CONNECTIONS",
    "ProviderCallError",
    "ProviderClient",
    "ProviderErrorCode",
    "ProviderRequest",
    "ProviderResponse",
    "ShardedTransport",
    "StructuredOutputMode",
    "make_http_client",
]

USER_AGENT: Final = "construct-mcp/0.1"

#: How a request asks for an answer matching the step's output schema. ``auto``: the best way the
#: endpoint supports (Anthropic: a forced tool; OpenAI-compatible: ``json_schema``, falling back to
#: ``json_object`` with the schema, then to ``prompt``); ``prompt``: only the prompt's "Answer
#: format" section, then parsing. ``json_schema`` / ``json_object`` pin one OpenAI-compatible mode.
StructuredOutputMode = Literal["auto", "json_schema", "json_object", "prompt"]
STRUCTURED_OUTPUT_MODES: Final[tuple[StructuredOutputMode, ...]] = (
    "auto",
    "json_schema",
    "json_object",
    "prompt",
)

#: The name of the tool / response format that carries a typed answer.
ANSWER_TOOL: Final = "answer"


class ProviderErrorCode(StrEnum):
    """The stable codes of provider-call failures (``TypedError.code``)."""

    TRANSPORT_ERROR = "transport_error"
    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"
    QUOTA_EXHAUSTED = "quota_exhausted"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    AUTH = "auth"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    CONTENT_FILTERED = "content_filtered"
    TRUNCATED = "truncated"
    REASONING_ONLY = "reasoning_only"
    EMPTY_RESPONSE = "empty_response"
    MALFORMED_RESPONSE = "malformed_response"
    OVER_MAX_TOKENS = "over_max_tokens"


#: Whether a code is worth another attempt, before any server hint (``x-should-retry``) is applied.
RETRYABLE_BY_CODE: MappingProxyType[ProviderErrorCode, bool] = MappingProxyType(
    {
        ProviderErrorCode.TRANSPORT_ERROR: True,
        ProviderErrorCode.TIMEOUT: True,
        ProviderErrorCode.RATE_LIMITED: True,
        ProviderErrorCode.QUOTA_EXHAUSTED: False,
        ProviderErrorCode.OVERLOADED: True,
        ProviderErrorCode.SERVER_ERROR: True,
        ProviderErrorCode.AUTH: False,
        ProviderErrorCode.INVALID_REQUEST: False,
        ProviderErrorCode.CONTEXT_LENGTH_EXCEEDED: False,
        ProviderErrorCode.CONTENT_FILTERED: False,
        ProviderErrorCode.TRUNCATED: False,
        ProviderErrorCode.REASONING_ONLY: False,
        # Retryable, but capped per code by the retry policy (DEFAULT_MAX_RETRIES_BY_CODE):
        # the client cannot know how many attempts came before.
        ProviderErrorCode.EMPTY_RESPONSE: True,
        ProviderErrorCode.MALFORMED_RESPONSE: True,
        # The provider ignores the limit: the same request would overshoot again.
        ProviderErrorCode.OVER_MAX_TOKENS: False,
    }
)


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One model call: a system prompt and a single user turn.

    ``timeout_seconds``, when set, replaces the HTTP client's *read* timeout for this call only
    (a step's own time limit); connect, write and pool timeouts stay as configured on the client.
    ``output_schema``, when set, asks for a JSON answer matching it, the way the client's
    :data:`StructuredOutputMode` says; the response's ``text`` is then that JSON (the caller
    validates it).
    ``on_delta``, when set, receives each piece of output text as a streamed answer arrives (the
    forced tool's JSON text for a typed step); it must not block, and nothing it receives is
    recorded: the response's ``text`` is the whole answer, once complete.
    """

    model: str
    system: str
    user: str
    max_tokens: int
    temperature: float | None = None
    timeout_seconds: float | None = None
    output_schema: Mapping[str, Any] | None = None
    on_delta: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("ProviderRequest.model must not be empty")
        if self.max_tokens < 1:
            raise ValueError("ProviderRequest.max_tokens must be at least 1")
        if self.timeout_seconds is not None and self.timeout_seconds <= 0:
            raise ValueError("ProviderRequest.timeout_seconds must be positive")


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """A usable answer: non-empty text that the model finished normally."""

    text: str
    telemetry: Telemetry
    stop_reason: str | None = None


class ProviderCallError(Exception):
    """One failed attempt, as data: ``error`` (the typed error) and ``telemetry`` (what was measured).

    The message is ``"<code>: <message>"``, built only from the already-scrubbed typed error, so
    ``str()`` and ``repr()`` never show a key or a header.
    """

    def __init__(self, error: TypedError, telemetry: Telemetry) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error
        self.telemetry = telemetry

    @property
    def code(self) -> str:
        return self.error.code

    @property
    def retryable(self) -> bool:
        return self.error.retryable


class ProviderClient(Protocol):
    """A model endpoint that answers one request per call."""

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        """Make exactly one HTTP attempt and return usable text.

        Raises :class:`ProviderCallError` for every failure: transport, HTTP status, or a 2xx whose
        content is unusable. Never retries, never sleeps, never shields itself from cancellation: an
        enclosing anyio cancel scope aborts the request in flight. Not idempotent: a call that times
        out after the request was sent may still be billed (``telemetry.possible_duplicate_call``).
        """
        ...


def make_http_client(
    transport: httpx2.AsyncBaseTransport | None = None,
    *,
    connect_timeout: float = 10.0,
    read_timeout: float = 600.0,
    write_timeout: float = 30.0,
    pool_timeout: float | None = None,
    max_connections: int = 32,
    max_keepalive_connections: int | None = None,
    keepalive_expiry: float = 30.0,
    trust_env: bool = True,
) -> httpx2.AsyncClient:
    """A pooled client for provider calls; share one per process, close it at shutdown.

    Redirects are not followed: a redirect means a wrong base URL, and following one could carry
    the key to another host. The client makes no retries of its own (the durable step does).

    Every timeout is explicit: ``read_timeout`` is long by default because a non-streaming model
    call sends nothing until the whole answer is ready (the official SDKs default to 600 s). Pass a
    ``transport`` (``httpx2.MockTransport`` in unit tests) to replace the network; the pool limits
    then belong to that transport. ``trust_env`` honours ``HTTPS_PROXY`` / ``NO_PROXY``.

    Waiting for a pooled connection is a local wait, not the provider's time: by default it has no
    deadline (``pool_timeout=None``), so a call queued behind others is never recorded as a
    timed-out attempt. Size ``max_connections`` to the calls the process makes at once (the server
    passes :attr:`~orchestration.workers.provider_worker.ProviderSettings.max_connections`, the sum
    of the providers' ``max_concurrency``); idle connections kept alive default to the same number.
    The connections are pooled in shards (:class:`ShardedTransport`), so that a thousand calls in
    flight do not make every request's start and end walk a thousand connections.
    """
    keepalive = max_connections if max_keepalive_connections is None else max_keepalive_connections
    if transport is None:
        transport = ShardedTransport(
            max_connections=max_connections,
            max_keepalive_connections=keepalive,
            keepalive_expiry=keepalive_expiry,
            trust_env=trust_env,
        )
    return httpx2.AsyncClient(
        transport=transport,
        timeout=httpx2.Timeout(
            connect=connect_timeout, read=read_timeout, write=write_timeout, pool=pool_timeout
        ),
        follow_redirects=False,
        trust_env=trust_env,
        headers={"user-agent": USER_AGENT},
    )


#: the most connections one pool of a :class:`ShardedTransport` holds
SHARD_CONNECTIONS: Final = 64


class ShardedTransport(httpx2.AsyncBaseTransport):
    """The provider calls' connection pool, as ``ceil(max_connections / SHARD_CONNECTIONS)``
    pools of at most :data:`SHARD_CONNECTIONS` connections each, the limits split among them.

    httpcore's pool walks all its connections and queued requests on every request's start and
    end: with 1,000 calls in flight, a request on a new connection costs 3.3 ms of CPU in one pool
    and 2.4 ms in shards of 64 (``bench/provider_pool.py``, this 2-core machine). A request goes
    to the shard with the smallest share of its limit in use (ties: the first), so no request
    waits on a full shard while another has room, and the total never exceeds
    ``max_connections``: ``max_connections`` requests open at once fill every shard to its limit.
    A request's count is given back when its response is closed.
    Proxies from the environment are the client's own mounts, as without shards.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        max_keepalive_connections: int,
        keepalive_expiry: float,
        trust_env: bool = True,
    ) -> None:
        count = max(1, -(-max_connections // SHARD_CONNECTIONS))
        self.limits = _split(max_connections, count)
        keep = _split(max_keepalive_connections, count)
        self._shards = [
            httpx2.AsyncHTTPTransport(
                limits=httpx2.Limits(
                    max_connections=limit, max_keepalive_connections=kept, keepalive_expiry=keepalive_expiry
                ),
                trust_env=trust_env,
            )
            for limit, kept in zip(self.limits, keep, strict=True)
        ]
        #: requests open (sent, response not closed yet) per shard
        self.open = [0] * count

    def _pick(self) -> int:
        best = 0
        for n in range(1, len(self.open)):
            if self.open[n] * self.limits[best] < self.open[best] * self.limits[n]:
                best = n  # the lowest share of its limit in use
        return best

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        n = self._pick()
        self.open[n] += 1
        try:
            response = await self._shards[n].handle_async_request(request)
        except BaseException:
            self.open[n] -= 1
            raise
        response.stream = _Counted(response.stream, self.open, n)
        return response

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal whole shares (the first ones larger by one)."""
    return [total // parts + (n < total % parts) for n in range(parts)]


class _Counted(httpx2.AsyncByteStream):
    """A response's stream that gives its shard's count back once, when closed."""

    def __init__(self, stream: httpx2.AsyncByteStream | httpx2.SyncByteStream, open_: list[int], shard: int):
        assert isinstance(stream, httpx2.AsyncByteStream)
        self._stream = stream
        self._open = open_
        self._shard = shard
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._open[self._shard] -= 1
        await self._stream.aclose()
