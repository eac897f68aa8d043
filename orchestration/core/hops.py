"""Delegation hops: how far a chain of agent delegations has gone, and the two refusals that end a
delegation loop (:func:`check_start`: ``delegation_loop``, ``delegation_depth_exceeded``).

The hops and servers a run received are recorded in it, so its agent steps send the same onward
(:func:`onward`) in any process, after any restart. A server's id is random per process
(:func:`new_server_id`): the loop check never refuses a start that is not a loop, and may miss
one (see docs/chains.md, Agents); the hop bound is the backstop.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from pydantic import ValidationError

from orchestration.core.models import ChainSnapshot, Delegation
from orchestration.errors import DelegationDepthExceeded, DelegationLoop, InvalidArgument

#: The ``_meta`` key of a ``tools/call`` that carries a delegation (namespaced, as MCP asks)
DELEGATION_META = "construct-mcp/delegation"

#: the most servers a delegation lists (the oldest are dropped beyond)
_MAX_SERVERS = 50


def new_server_id() -> str:
    """A new identity for this server process: ``srv-`` and 64 random bits (nothing about the
    host: the id travels to other servers and is recorded there)."""
    return f"srv-{secrets.token_hex(8)}"


def onward(incoming: Delegation | None, server_id: str) -> Delegation:
    """What an agent step of a run started by ``incoming`` (None: by no agent) sends on: one hop
    more, and this server (``server_id``) added to the servers passed."""
    hops = (incoming.hops if incoming is not None else 0) + 1
    servers = (*(incoming.servers if incoming is not None else ()), server_id)
    return Delegation(hops=hops, servers=servers[-_MAX_SERVERS:])


def from_meta(meta: Mapping[str, object] | None) -> Delegation | None:
    """The delegation a request's ``_meta`` carries (None: none); ``invalid_argument`` when the
    key is there but not of the documented shape (a client's input, checked as arguments are)."""
    if meta is None or DELEGATION_META not in meta:
        return None
    try:
        return Delegation.model_validate(meta[DELEGATION_META])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "value"
        raise InvalidArgument(
            f"_meta[{DELEGATION_META!r}].{where}: {first['msg'].lower()}; expected "
            '{"hops": 1..1000, "servers": [up to 50 server ids]}'
        ) from None


def check_start(delegation: Delegation | None, chain: ChainSnapshot, server_id: str) -> None:
    """Refuse a start that came through ``delegation`` and would loop (``delegation_loop``: it
    passed through this server, ``server_id``, already) or go deeper than ``chain`` allows
    (``delegation_depth_exceeded``: more hops than its ``max_depth``)."""
    if delegation is None:
        return
    if server_id in delegation.servers:
        raise DelegationLoop(
            f"this start came through agent delegation that already passed this server ({server_id}; "
            f"hop {delegation.hops}): an agent step here delegates back to this server, directly or "
            "through others; point the agent at another server"
        )
    if delegation.hops > chain.max_depth:
        raise DelegationDepthExceeded(
            f"this start is hop {delegation.hops} of an agent delegation; chain {chain.name!r} "
            f"allows {chain.max_depth} (max_depth)"
        )


__all__ = ["DELEGATION_META", "check_start", "from_meta", "new_server_id", "onward"]
