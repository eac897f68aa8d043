"""The stdin relay behind SIGTERM on stdio (``server/transports/stdio.py``): what arrives on the real input
reaches the reader, and :meth:`StdinRelay.end` gives the reader the end of its input although the
real input is still open — which is how SIGTERM stops a stdio server like the end of stdin."""

from __future__ import annotations

import json
import os

import anyio

from server.transports.invalid_messages import CUT_MARK
from server.transports.stdio import TOO_LARGE_METHOD, StdinRelay, request_id_in


async def test_relayed_bytes_then_end_of_input_while_the_source_stays_open() -> None:
    source_read, source_write = os.pipe()
    reader = os.dup(source_read)  # the descriptor the relay replaces, standing in for fd 0
    relay = StdinRelay(reader)
    relay.start()
    try:
        os.write(source_write, b'{"jsonrpc": "2.0"}\n')
        with anyio.fail_after(5):
            line = await anyio.to_thread.run_sync(os.read, reader, 100)
        assert line == b'{"jsonrpc": "2.0"}\n'
        relay.end()
        relay.end()  # idempotent
        with anyio.fail_after(5):
            assert await anyio.to_thread.run_sync(os.read, reader, 100) == b""
        assert relay.ended
        # Input arriving after the end is not passed on.
        os.write(source_write, b"late\n")
    finally:
        relay.end()
        for fd in (reader, source_read, source_write):
            os.close(fd)


async def test_the_source_closing_ends_the_input() -> None:
    source_read, source_write = os.pipe()
    reader = os.dup(source_read)
    relay = StdinRelay(reader)
    relay.start()
    try:
        os.write(source_write, b"last line\n")
        os.close(source_write)
        chunks = []
        with anyio.fail_after(5):
            while chunk := await anyio.to_thread.run_sync(os.read, reader, 100):
                chunks.append(chunk)
        assert b"".join(chunks) == b"last line\n"
    finally:
        relay.end()
        os.close(reader)
        os.close(source_read)


async def relay_all(chunks: list[bytes], max_line_bytes: int) -> bytes:
    """What a relay bounded to ``max_line_bytes`` passes on for ``chunks`` (then the end of input)."""
    source_read, source_write = os.pipe()
    reader = os.dup(source_read)
    relay = StdinRelay(reader, max_line_bytes=max_line_bytes)
    relay.start()
    out = []
    try:

        async def feed() -> None:
            for chunk in chunks:
                await anyio.to_thread.run_sync(os.write, source_write, chunk)
            os.close(source_write)

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            with anyio.fail_after(10):
                while chunk := await anyio.to_thread.run_sync(os.read, reader, 65536):
                    out.append(chunk)
    finally:
        relay.end()
        os.close(reader)
        os.close(source_read)
    return b"".join(out)


async def test_a_line_over_the_bound_is_cut_and_answered_by_its_id() -> None:
    big = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"output":"' + b"x" * 300_000 + b'"}}\n'
    chunks = [b'{"jsonrpc":"2.0","id":1}\n', *(big[i : i + 1000] for i in range(0, len(big), 1000))]
    chunks.append(b'{"jsonrpc":"2.0","id":8}\n')
    lines = (await relay_all(chunks, max_line_bytes=2000)).split(b"\n")
    assert lines[0] == b'{"jsonrpc":"2.0","id":1}'
    cut = lines[1].removesuffix(CUT_MARK.encode())  # marked, so that no parse error answers it
    assert cut != lines[1] and big.startswith(cut) and len(cut) <= 2000, "at most the bound of the long line"
    assert json.loads(lines[2]) == {
        "jsonrpc": "2.0",
        "id": 7,
        "method": TOO_LARGE_METHOD,
        "params": {"limit": 2000},
    }
    assert lines[3:] == [b'{"jsonrpc":"2.0","id":8}', b""]


async def test_lines_within_the_bound_pass_unchanged() -> None:
    data = b"".join(b'{"id":%d,"x":"%s"}\n' % (n, b"y" * n) for n in range(200))
    chunks = [data[i : i + 777] for i in range(0, len(data), 777)]
    assert await relay_all(chunks, max_line_bytes=250) == data


def test_request_id_in() -> None:
    assert request_id_in(b'{"jsonrpc":"2.0","id":42,"method":"x","params":{"ou') == 42
    assert request_id_in(b'{"jsonrpc":"2.0","id":"a\\"b","method":"x"') == 'a"b'
    assert request_id_in(b'{"jsonrpc":"2.0","method":"x","params":{"id":3,') is None
    assert request_id_in(b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":') is None
    assert request_id_in(b'{"jsonrpc":"2.0","id":4') is None, "an id cut off may be longer"
