"""The built-in specialists: one Markdown file each (its persona), read by the catalog as package data."""

from __future__ import annotations

__all__: list[str] = []
