"""The MCP surface: the tools and their strict arguments, what every tool does around its own work
(roles, bounded waits), runs as resources and their subscriptions, chains as prompts, elicitation at
gates, MCP Tasks, what a host learns on connecting (:mod:`server.mcp.server_card`), and the objects a
server process hands to all of them (:mod:`server.mcp.services`)."""

from __future__ import annotations

__all__ = [
    "answering",
    "arguments",
    "budget_argument",
    "chain_prompts",
    "elicit",
    "fork_tool",
    "resources",
    "server_card",
    "services",
    "subscriptions",
    "tasks",
    "tools",
]
