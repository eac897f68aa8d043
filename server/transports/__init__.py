"""How a host reaches the server: stdio (SIGTERM as the end of stdin, ``initialize`` answered
before the SDK is imported), the HTTP transports' ASGI apps with their limits, bearer-token
protection (static tokens, and the access tokens of an OAuth issuer: the resource server, with
PyJWT behind its adapter), and uvicorn behind its adapter (the one module that relies on uvicorn's
internals)."""

from __future__ import annotations

__all__ = [
    "auth",
    "handshake",
    "http",
    "invalid_messages",
    "jwt_adapter",
    "resource_server",
    "stdio",
    "uvicorn_adapter",
]
