"""What callers send to the runtime's use cases: a :class:`StartRequest`, and the :class:`Limits` on
the size of everything they send; and how a start's execution contract is resolved
(:data:`ContractResolver`; :func:`inline_contract` when no provider is configured)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orchestration.core.costs import Budget
from orchestration.core.models import (
    ChainSnapshot,
    Delegation,
    ExecutionContract,
    ParentLink,
    WorkerBackend,
    canonical_hash,
)
from orchestration.errors import InvalidArgument, TooLarge, quoted


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits on what callers send (characters, or items for a list). Over a limit is a
    ``too_large`` error (an idempotency key or a cursor of the wrong length: ``invalid_argument``,
    since no valid one is that long). Every string a caller sends has one: what is recorded (a
    comment, an approver) is copied into the run's head or facts, and a 1 MB approver would slow
    every later write. The MCP tools publish the same bounds in their input schemas."""

    max_request_chars: int = 200_000
    max_output_chars: int = 1_000_000
    #: an approval's comment, a cancellation's reason
    max_comment_chars: int = 20_000
    max_approver_chars: int = 200
    max_idempotency_key_chars: int = 200
    #: a task id, a gate id
    max_id_chars: int = 100
    #: a chain, specialist or step name, a provider or model name
    max_name_chars: int = 100
    #: the specialists of a chain given as a list, the steps named in approve_before
    max_list_items: int = 50
    #: a runs_list cursor (the ones the stores give out are about 150 characters)
    max_cursor_chars: int = 400


#: The namespace of the idempotency keys of verified identities (``token:<identity>:<key>``, as
#: :func:`server.identity.start_identity` names the identity of a start's retry window).
KEY_NAMESPACE = "token:"


def stored_key(key: str, started_by: str | None) -> str:
    """The idempotency key ``key``, sent by ``started_by`` (a verified identity, or None: a local
    or unauthenticated caller), as the store keeps it: in the identity's namespace
    (``token:alice:<key>``), so that one identity's key never finds another's run nor takes a key
    another will need. Without an identity (stdio, the CLI, HTTP without tokens: one trusted
    identity) the key is kept as it is, as it always was. An identity has no ``:`` in its name,
    so the namespace ends at the first one after ``token:``."""
    return key if started_by is None else f"{KEY_NAMESPACE}{started_by}:{key}"


def shown_key(stored: str | None, started_by: str | None) -> str | None:
    """The idempotency key a run's view shows its client: the key as the client sent it
    (:func:`stored_key` undone); a key stored before keys were namespaced, or by a local caller,
    as it is."""
    if stored is None or started_by is None:
        return stored
    return stored.removeprefix(f"{KEY_NAMESPACE}{started_by}:")


@dataclass(frozen=True, slots=True)
class RetryWindow:
    """How a start without an idempotency key is told apart from a retry of an earlier one
    (``orchestrate_start``'s retry window, :mod:`orchestration.engine.start_window`): the same
    ``identity`` sending the same request within ``seconds`` gets the run it already started.
    ``new_run``: the caller asks for another run all the same (which a later retry then finds)."""

    identity: str
    seconds: float
    new_run: bool = False


@dataclass(frozen=True, slots=True)
class StartRequest:
    request: str
    chain: str | tuple[str, ...] | None = None
    approve_before: tuple[str, ...] = ()
    idempotency_key: str | None = None
    worker_backend: WorkerBackend | None = None
    provider: str | None = None
    model: str | None = None
    #: the whole run's time limit, from start; passing it fails the run with deadline_exceeded
    timeout_seconds: float | None = None
    #: each task's time limit, for steps whose chain definition sets none
    task_timeout_seconds: float | None = None
    #: the verified identity starting the run (recorded on ``run_created``); not part of the
    #: request's hash: who retries a start does not make it another request
    started_by: str | None = None
    #: the caller's trace context (W3C ``traceparent``), recorded on ``run_created``; not part of
    #: the request's hash either: a retried start in another trace is the same request
    traceparent: str | None = None
    #: the run's budget (see :mod:`orchestration.core.budget`); None: the chain's from the
    #: configuration, if any (applied by :func:`orchestration.core.budget.with_costs`)
    budget: Budget | None = None
    #: a host's child run (:mod:`orchestration.engine.children`): the parent task it is tied to, and the
    #: parent's time limit, which bounds the child's deadline; neither is part of the hash
    parent: ParentLink | None = None
    parent_deadline: datetime | None = None
    #: the agent delegation this start came through (a call's ``_meta``: see
    #: :mod:`orchestration.core.hops`), checked and recorded on ``run_created``; not part of the hash:
    #: the same start retried by a restarted server lists another server id
    delegation: Delegation | None = None
    #: without an idempotency key: the retry window that makes a retried start return the run
    #: an identical one made (None: every start without a key makes a run); not part of the hash
    retry: RetryWindow | None = None

    def deadline(self, now: datetime) -> datetime | None:
        """The run's deadline if it starts at ``now``: its ``timeout_seconds``, bounded by its
        parent's time limit."""
        own = None if self.timeout_seconds is None else now + timedelta(seconds=self.timeout_seconds)
        times = [t for t in (own, self.parent_deadline) if t is not None]
        return min(times) if times else None

    def request_hash(self) -> str:
        """What makes two starts "the same request" for idempotency (a budget counts when given:
        a start without one hashes as before budgets existed)."""
        budget = {} if self.budget is None else {"budget": self.budget.model_dump(mode="json")}
        return canonical_hash(
            budget
            | {
                "request": self.request,
                "chain": list(self.chain) if isinstance(self.chain, tuple) else self.chain,
                "approve_before": sorted(self.approve_before),
                "worker_backend": self.worker_backend,
                "provider": self.provider,
                "model": self.model,
                "timeout_seconds": self.timeout_seconds,
                "task_timeout_seconds": self.task_timeout_seconds,
            }
        )


ContractResolver = Callable[[StartRequest, ChainSnapshot], ExecutionContract]


def inline_contract(request: StartRequest, _: ChainSnapshot) -> ExecutionContract:
    if request.worker_backend not in (None, "inline"):
        raise InvalidArgument(
            f"worker_backend {quoted(request.worker_backend)} is not available on this server; use 'inline'"
        )
    return ExecutionContract(worker_backend="inline")


__all__ = ["ContractResolver", "Limits", "RetryWindow", "StartRequest", "inline_contract"]


def check_names(request: StartRequest, limits: Limits) -> None:
    """Bound the names a start carries (the chain, approve_before, provider and model): they are
    copied into the run, and an error quoting one must stay short."""
    names: list[tuple[str, str | None]] = [("provider", request.provider), ("model", request.model)]
    for field_name, values in (("chain", request.chain), ("approve_before", request.approve_before)):
        if isinstance(values, str) or values is None:
            names.append((field_name, values))
            continue
        if len(values) > limits.max_list_items:
            raise TooLarge(f"{field_name} has {len(values)} items; the limit is {limits.max_list_items}")
        names += [(f"{field_name}[{i}]", v) for i, v in enumerate(values)]
    for field_name, value in names:
        if value is not None and len(value) > limits.max_name_chars:
            raise TooLarge(
                f"{field_name} is {len(value)} characters; names have at most {limits.max_name_chars}"
            )


def check_id(name: str, value: str, limits: Limits) -> None:
    """A task or gate id a caller sends: present, and within ``limits.max_id_chars``."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} is empty; pass the id from next_action.{name}")
    if len(value) > limits.max_id_chars:
        raise TooLarge(f"{name} is {len(value)} characters; ids have at most {limits.max_id_chars}")


def check_start(request: StartRequest, limits: Limits) -> None:
    """What a start carries, checked before anything is resolved or written: a request that says
    something and is within its limit, an idempotency key of a sane length, bounded names, and time
    limits between 0 and 30 days."""
    text = request.request
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument("request is empty; say what the chain should work on")
    if len(text) > limits.max_request_chars:
        raise TooLarge(
            f"request is {len(text)} characters; the limit is {limits.max_request_chars} "
            "(CONSTRUCT_MAX_REQUEST_CHARS)"
        )
    key = request.idempotency_key
    if key is not None and not 1 <= len(key) <= limits.max_idempotency_key_chars:
        raise InvalidArgument(f"idempotency_key must be 1-{limits.max_idempotency_key_chars} characters")
    check_names(request, limits)
    for name, value in (
        ("timeout_seconds", request.timeout_seconds),
        ("task_timeout_seconds", request.task_timeout_seconds),
    ):
        if value is not None and not 0 < value <= 30 * 86400:
            raise InvalidArgument(f"{name} must be between 0 and 2592000 (30 days), not {value}")


def with_task_timeout(chain: ChainSnapshot, seconds: float | None) -> ChainSnapshot:
    """``chain`` with ``seconds`` as the time limit of every step whose definition sets none."""
    if seconds is None:
        return chain
    steps = tuple(
        s if s.timeout_seconds is not None else s.model_copy(update={"timeout_seconds": seconds})
        for s in chain.steps
    )
    return chain.model_copy(update={"steps": steps})


def whole_numbers(value: Any) -> Any:
    """``value`` (JSON read back from a protobuf ``Struct`` or ``Value``, where every number is a
    double: an A2A message's metadata, a data part) with whole numbers as ``int`` again, as the
    JSON its sender wrote had them, so that a schema's ``integer`` (or a count) accepts them."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value
