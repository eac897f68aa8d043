"""The pure core: the vocabulary, the records, the facts and how they fold into a run's head, and
the decision (``next_actions``) made from a head alone. No I/O, no clock but an injected one, no
import of any other layer: everything a restarted run decides again is decided here."""

from __future__ import annotations

from orchestration.core.approvals import Decision, agent_may_decide, gate_approvers
from orchestration.core.budget import budget_raise, limits, priced, with_costs
from orchestration.core.clock import SystemClock
from orchestration.core.costs import Budget, BudgetLimits, HostUsage, Spend, Tally
from orchestration.core.facts import (
    FACT_TYPES,
    ApprovalDecided,
    ApprovalRequested,
    AttemptFailed,
    AttemptStarted,
    ChainUpgraded,
    Fact,
    HostOutputSubmitted,
    HostTaskPrepared,
    PushConfigDeleted,
    PushConfigured,
    RouteDecided,
    RunCancelled,
    RunCreated,
    RunFinished,
    TaskCompleted,
    TaskFailed,
    dump_fact,
    parse_fact,
    parse_head,
)
from orchestration.core.fold import apply_write, head_from_creation
from orchestration.core.graph import is_parallel, latest, predecessors, settled
from orchestration.core.hops import DELEGATION_META, new_server_id
from orchestration.core.hops import from_meta as delegation_from_meta
from orchestration.core.ids import RUN_ID_PATTERN, validate_run_id
from orchestration.core.inputs import Limits, RetryWindow, StartRequest, shown_key, stored_key, whole_numbers
from orchestration.core.memo import by_identity
from orchestration.core.models import (
    AGENT_APPROVER,
    GATE_STATUS_OF,
    RECORD_FORMAT,
    AttemptRecord,
    ChainSnapshot,
    ChainStep,
    DecisionChannel,
    Delegation,
    ExecutionContract,
    GateState,
    PromptRead,
    RunHead,
    SpecialistSnapshot,
    TaskState,
    Telemetry,
    TypedError,
    gate_id_for,
    text_hash,
)
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.pricing import Price, price_table
from orchestration.core.routing import RevisePlan, revise_offered, revise_plan
from orchestration.core.upgrades import CannotMove, UpgradePlan, plan_upgrade
from orchestration.core.vocabulary import RunStatus, TaskStatus

__all__ = [
    "AGENT_APPROVER",
    "DELEGATION_META",
    "FACT_TYPES",
    "GATE_STATUS_OF",
    "RECORD_FORMAT",
    "RUN_ID_PATTERN",
    "ApprovalDecided",
    "ApprovalRequested",
    "AttemptFailed",
    "AttemptOutcome",
    "AttemptRecord",
    "AttemptStarted",
    "AttemptSucceeded",
    "Budget",
    "BudgetLimits",
    "CannotMove",
    "ChainSnapshot",
    "ChainStep",
    "ChainUpgraded",
    "Decision",
    "DecisionChannel",
    "Delegation",
    "ExecutionContract",
    "Fact",
    "GateState",
    "HostOutputSubmitted",
    "HostTaskPrepared",
    "HostUsage",
    "Limits",
    "Price",
    "PromptRead",
    "PushConfigDeleted",
    "PushConfigured",
    "RetryWindow",
    "RevisePlan",
    "RouteDecided",
    "RunCancelled",
    "RunCreated",
    "RunFinished",
    "RunHead",
    "RunStatus",
    "SpecialistSnapshot",
    "Spend",
    "StartRequest",
    "SystemClock",
    "Tally",
    "TaskCompleted",
    "TaskFailed",
    "TaskState",
    "TaskStatus",
    "Telemetry",
    "TypedError",
    "UpgradePlan",
    "agent_may_decide",
    "apply_write",
    "budget_raise",
    "by_identity",
    "delegation_from_meta",
    "dump_fact",
    "gate_approvers",
    "gate_id_for",
    "head_from_creation",
    "is_parallel",
    "latest",
    "limits",
    "new_server_id",
    "parse_fact",
    "parse_head",
    "plan_upgrade",
    "predecessors",
    "price_table",
    "priced",
    "revise_offered",
    "revise_plan",
    "settled",
    "shown_key",
    "stored_key",
    "text_hash",
    "validate_run_id",
    "whole_numbers",
    "with_costs",
]
