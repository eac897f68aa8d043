"""The provider calls' connection pool in shards (orchestration.workers.model_calls
.ShardedTransport, issue 24): ``max_connections`` requests are all sent at once, spread evenly over
the shards, never more than ``max_connections`` connections; one more waits (no deadline) until a
response is closed and then goes; a response's slot is given back on close, also when the call is
cancelled; connections are reused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.abc

from orchestration.workers.model_calls import SHARD_CONNECTIONS, ShardedTransport, make_http_client

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@dataclass
class Holder:
    """An HTTP/1.1 server that answers each request once :attr:`release` is set (keep-alive), and
    counts connections: open now, most at once, ever accepted; requests received."""

    release: anyio.Event = field(default_factory=anyio.Event)
    open: int = 0
    peak: int = 0
    accepted: int = 0
    received: int = 0

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        self.open += 1
        self.accepted += 1
        self.peak = max(self.peak, self.open)
        buffered = b""
        try:
            async with stream:
                while True:
                    while b"\r\n\r\n" not in buffered:
                        buffered += await stream.receive()
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    length = content_length(head)
                    while len(buffered) < length:
                        buffered += await stream.receive()
                    buffered = buffered[length:]
                    self.received += 1
                    await self.release.wait()
                    await stream.send(ANSWER)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self.open -= 1


@asynccontextmanager
async def holder() -> AsyncIterator[tuple[Holder, str]]:
    server = Holder()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", backlog=1024)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.serve)
        try:
            yield server, f"http://127.0.0.1:{port}/v1/messages"
        finally:
            tg.cancel_scope.cancel()


async def wait_for(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110 (polls a counter)
            await anyio.sleep(0.01)


def test_the_limits_are_split_evenly_over_shards_of_at_most_the_shard_size() -> None:
    transport = ShardedTransport(max_connections=1000, max_keepalive_connections=1000, keepalive_expiry=30)
    assert len(transport.limits) == -(-1000 // SHARD_CONNECTIONS)
    assert sum(transport.limits) == 1000
    assert max(transport.limits) - min(transport.limits) <= 1
    assert max(transport.limits) <= SHARD_CONNECTIONS
    assert ShardedTransport(max_connections=5, max_keepalive_connections=5, keepalive_expiry=30).limits == [5]


async def test_max_connections_requests_are_sent_at_once_and_one_more_waits_for_a_closed_response() -> None:
    limit = 2 * SHARD_CONNECTIONS + 10  # three shards
    answers: list[int] = []
    async with holder() as (server, url), make_http_client(max_connections=limit) as http:
        transport = http._transport
        assert isinstance(transport, ShardedTransport) and len(transport.limits) == 3

        async def call() -> None:
            response = await http.post(url, json={"n": 1})
            answers.append(response.status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(limit + 1):
                tg.start_soon(call)
            await wait_for(lambda: server.received == limit)
            await anyio.sleep(0.2)
            # All but one sent at once, spread over the shards to their limits; the last waits.
            assert server.received == limit and server.peak == limit
            assert sum(transport.open) == limit + 1
            assert all(n >= most for n, most in zip(transport.open, transport.limits, strict=True))
            server.release.set()
        assert answers == [200] * (limit + 1)
        assert server.received == limit + 1
        assert server.accepted == limit, "the waiting request went on a connection given back"
        assert transport.open == [0, 0, 0]


async def test_a_cancelled_call_gives_its_slot_back() -> None:
    async with holder() as (server, url), make_http_client(max_connections=3) as http:
        transport = http._transport
        assert isinstance(transport, ShardedTransport)
        with anyio.move_on_after(0.3):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(http.post, url)
        assert transport.open == [0]
        server.release.set()
        # The pool is whole again: three calls go (on fresh connections: the cancelled ones are
        # closed mid-request).
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(http.post, url)
        assert transport.open == [0]
        await wait_for(lambda: server.open <= 3)
        assert server.peak <= 3
