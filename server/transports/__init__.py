"""How a host reaches the server: stdio (SIGTERM as the end of stdin), the HTTP transports' ASGI
apps with their limits, and bearer-token protection."""

from __future__ import annotations

__all__ = [
    "auth",
    "http",
    "stdio",
]
