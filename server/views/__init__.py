"""What the tools answer, built from the persisted record only: the run view (compact by default),
the next step it asks of its caller, its graph, budget and children, run listings, the event feed,
timelines, who did what (the audit), and the published outline of each answer's schema."""

from __future__ import annotations

__all__ = [
    "audit",
    "budget_view",
    "children_view",
    "compact",
    "events",
    "graph_view",
    "listing",
    "next_step",
    "outline",
    "parts",
    "run_view",
    "timeline",
]
