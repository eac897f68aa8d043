"""The MCP edge and the composition root (:mod:`server.app`): everything that turns the domain
(:mod:`orchestration`) into a server a host talks to.

* :mod:`server.settings` — the settings, the store, provider and agent configuration, logs, telemetry;
* :mod:`server.mcp` — the tools, their arguments, resources, prompts, elicitation, MCP Tasks;
* :mod:`server.views` — what the tools answer: run views, the next step, listings, events;
* :mod:`server.transports` — stdio, Streamable HTTP and SSE, bearer-token auth;
* :mod:`server.web` — the run pages and the MCP Apps panel;
* :mod:`server.cli` — the ``construct-mcp`` command line (it mirrors the tools);
* :mod:`server.sdk` — the one module that relies on the MCP SDK's internals."""

from __future__ import annotations

__all__ = [
    "app",
    "cli",
    "identity",
    "mcp",
    "sdk",
    "settings",
    "transports",
    "views",
    "web",
    "wiring",
]
