"""The shape every figure of bench/boundaries.py is measured with (issue 11): a 50-step chain,
1 KB output per step, 20 runs at once for the concurrent figures."""

from __future__ import annotations

STEPS = 50
CONCURRENT = 20
OUTPUT = ("0123456789abcdef" * 64)[:1024]  # 1 KB
CHAIN = tuple(["engineer"] * STEPS)
