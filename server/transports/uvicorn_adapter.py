"""uvicorn's internals this server relies on, in one place: :class:`GracefulServer` keeps uvicorn
from re-raising the signal it caught after a graceful shutdown, so a clean stop exits 0 after the
SSE lifespan closes. ``tests/unit/server/test_uvicorn_adapter.py`` pins the reliance;
``pyproject.toml`` bounds uvicorn to the minor version it passed with.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn

#: The signals uvicorn handles (on POSIX) and this server stops on.
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which restores the signal handlers instead of re-raising the signal after
    a graceful shutdown (see the module docstring).

    ``on_exit`` is called (on the event loop) at the first SIGTERM/SIGINT, as soon as the shutdown
    begins."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self._on_exit is not None:
            # A signal handler may interrupt the loop anywhere: run the callback from the loop.
            asyncio.get_running_loop().call_soon_threadsafe(self._on_exit)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
