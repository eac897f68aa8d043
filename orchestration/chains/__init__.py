"""Chains and what they are made of: the catalog (built-in specialists and chains plus the user's
``construct.toml``), the checks made when a chain is loaded, typed output schemas, and the prompts a
task is given. Imports only :mod:`orchestration.core`."""

from __future__ import annotations

from orchestration.chains.catalog import NAME_PATTERN, Catalog, ChainDefinition
from orchestration.chains.prompts import TaskPrompt

__all__ = [
    "NAME_PATTERN",
    "Catalog",
    "ChainDefinition",
    "TaskPrompt",
]
