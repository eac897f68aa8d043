"""How a host reaches the server: stdio (SIGTERM as the end of stdin, ``initialize`` answered
before the SDK is imported), the HTTP transports' ASGI apps with their limits, bearer-token
protection, and uvicorn behind its adapter (the one module that relies on uvicorn's internals)."""

from __future__ import annotations

__all__ = [
    "auth",
    "handshake",
    "http",
    "stdio",
    "uvicorn_adapter",
]
