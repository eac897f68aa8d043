"""The stdin relay behind SIGTERM on stdio (``server/stdio.py``): what arrives on the real input
reaches the reader, and :meth:`StdinRelay.end` gives the reader the end of its input although the
real input is still open — which is how SIGTERM stops a stdio server like the end of stdin."""

from __future__ import annotations

import os

import anyio

from server.stdio import StdinRelay


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
