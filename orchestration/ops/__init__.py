"""Operations on whole runs: fork and rewind, export and import, retention (pruning ended runs),
a chain change rolled out to the live runs.
Uses the engine; the engine never uses these."""

from __future__ import annotations

from orchestration.ops.export import RunExport, derive, export_lines, read_export, snapshot
from orchestration.ops.forking import ForkRequest, fork_run
from orchestration.ops.retention import PRUNABLE, import_export, parse_statuses, prune
from orchestration.ops.rollout import Rollout, at_startup, behind, live_runs, roll_out

__all__ = [
    "PRUNABLE",
    "ForkRequest",
    "Rollout",
    "RunExport",
    "at_startup",
    "behind",
    "derive",
    "export_lines",
    "fork_run",
    "import_export",
    "live_runs",
    "parse_statuses",
    "prune",
    "read_export",
    "roll_out",
    "snapshot",
]
