"""The domain: durable specialist chains, with no knowledge of MCP, HTTP servers or databases.

Layers, each importing only those before it (DESIGN §5; ``tests/unit/test_architecture.py``):

* :mod:`orchestration.core` — pure: vocabulary, records, facts, the fold, the decision;
* :mod:`orchestration.chains` — the catalog, load-time checks, output schemas, prompts;
* :mod:`orchestration.workers` — the worker port and its backends (all HTTP client code);
* :mod:`orchestration.engine` — the runtime, the drive, the dispatcher, child runs, delegation;
* :mod:`orchestration.ops` — fork, export and import, retention.

Beside them, importable from every layer: :mod:`orchestration.errors` (the exception hierarchy),
:mod:`orchestration.store` (the ``RunStore`` port that :mod:`stores` implements) and
:mod:`orchestration.tracing` (OpenTelemetry spans). ``server`` and ``stores`` import only these
modules and the names each layer package exports in its ``__all__``."""

from __future__ import annotations

__all__ = [
    "chains",
    "core",
    "engine",
    "errors",
    "ops",
    "store",
    "tracing",
    "workers",
]
