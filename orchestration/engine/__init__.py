"""The effectful engine: the :class:`Runtime` use cases (start, submit a host's output, approve,
cancel, status, drive), the drive that runs decide → act → record under a lease, fan-out,
delegation to agents, child runs, the dispatcher, change notification and the read side. Imports
the layers below it, never :mod:`orchestration.ops`.

Words used here with one meaning each:

* **drive** — advancing a run under its lease (decide → act → record); only a drive executes
  (calls a provider or an agent, starts a child).
* **host's path** — a host's output, a gate's decision or an inline start recorded with what
  follows from it in one compare-and-swap, without a lease (:mod:`~orchestration.engine.host_writes`).
* **written** (:class:`Written`) — what one call on the host's path wrote: the head after it, its
  facts, the outputs the next prompts are rendered from, and the snapshot a view shows.
* **memory** (:class:`RunMemory`) — what a process keeps of the runs it wrote and showed, per
  run version; **shown last** is what it returns for a run (a write, or a snapshot read).
* **snapshot** (:class:`RunSnapshot`) — a run as a view shows it at one version, read in one pass
  over its log (or extended from an earlier one).
* **prepared** — a host task whose prompt was rendered and recorded (``host_task_prepared``),
  waiting for the host's output; nothing else is "prepared".
* **answer** — what the server answers a tool call with; the engine has none.
"""

from __future__ import annotations

from orchestration.engine.chain_versions import ChainVersions, named, parse_version
from orchestration.engine.changes import is_settled
from orchestration.engine.children import live_children
from orchestration.engine.deltas import OutputDeltas, OutputPiece, TaskText
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.host_writes import Forgetful, RunMemory, Written
from orchestration.engine.leased_run import RuntimeSettings
from orchestration.engine.push_configs import delete_push_config, push_configs_in, set_push_config
from orchestration.engine.reading import RunSnapshot
from orchestration.engine.runtime import Runtime
from orchestration.engine.start_window import repeated
from orchestration.engine.upgrading import Upgrade

__all__ = [
    "ChainVersions",
    "Dispatcher",
    "Forgetful",
    "OutputDeltas",
    "OutputPiece",
    "RunMemory",
    "RunSnapshot",
    "Runtime",
    "RuntimeSettings",
    "TaskText",
    "Upgrade",
    "Written",
    "delete_push_config",
    "is_settled",
    "live_children",
    "named",
    "parse_version",
    "push_configs_in",
    "repeated",
    "set_push_config",
]
