"""Every chain served as an A2A agent: what a call does to runs (:mod:`server.a2a.chain_agent`) and
the wire (:mod:`server.a2a.sdk_face`, imported only when the ``a2a`` extra is installed)."""

from __future__ import annotations

__all__ = [
    "chain_agent",
    "sdk_face",
]
