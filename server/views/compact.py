"""The answer a tool sends for a run view: compact by default, whole on request.

A host model pays for every byte of an answer with its context window, on every call, and
frameworks that keep one conversation pile the answers up. So the default answer carries only what
a model acts on:

* the run's ``run_id``, ``status`` and ``status_kind``;
* ``next_action`` (and ``more_actions`` when branches wait at once): the exact call to make, and
  ``existing_run`` when a start found the run an identical start made (the retry window);
* ``tasks``, one short object each: ``task_id`` and ``status``, what a task that has not ended
  ``waits_for``, and for a finished one its output preview (unless a prompt in the same answer
  carries it: outputs travel once), length and URI (plus a small typed
  ``value``, its ``error``, and why it exists when another task sent the work back or a gate's
  revise made it);
* ``gates`` as their id, task, position, status and what a decision needs (decisions, approvers,
  expiry, a budget gate's note, an exhausted loop's history) and, once decided, how (comment,
  approver, channel), without their timestamps;
* ``children``, ``error``, ``warnings``, ``budget``, the links ``forked_from`` and ``parent``, and
  ``costs`` (tokens and dollars spent) — each only when there is something to say;
* ``tasks_left_out``, when the tasks are more than an answer of ``max_answer_chars`` holds: the
  tasks it leaves out, counted (see :func:`server.views.parts.fitted`).

Nulls, empty lists and fields at their defaults are left out. The chain definition, the execution
contract, each attempt's telemetry, the timestamps, ``semantics`` and ``version`` are in the *full*
answer: ``run_status`` with ``detail="full"`` (which also carries every whole output and the whole
request), and the ``run://<run_id>`` resource.

**Content and roles.** A run's content — its request, each output (whole, preview, typed value,
sha256), the host tasks' prompts, gate comments, an exhausted loop's history and the messages of
typed errors (which may quote an output) — is for those who
may read the run or started it (:meth:`server.identity.Caller.sees_content`). Every view a caller
is answered with passes through :func:`content_for` (called by
:meth:`server.mcp.services.Services.view`, the one place views are made for callers): for any other
caller, such as an identity with only ``operate`` or ``approve`` acting on another identity's run,
the content is left out and ``withheld`` is true; status, tasks, gates, ids, lengths and
``next_action``'s call stay, so the call can still be made by someone who may.

:func:`answer_data` is a pure function of the view, so an answer is as deterministic as the view it
is made of (:meth:`server.mcp.services.Services.answer_of` dumps each run version once).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from orchestration.core import TaskStatus
from server.views.next_step import Approve, RunHostTask
from server.views.outline import View
from server.views.run_view import ErrorView, GateView, RunView, TaskView

#: What a withheld prompt (or an exhausted gate's history) says instead.
WITHHELD = "(withheld: this identity may not read the run's content; that needs the 'read' role)"

#: The task fields a compact answer keeps (when set), in this order.
TASK_FIELDS = (
    "task_id",
    "status",
    "waits_for",
    "output",
    "output_preview",
    "output_chars",
    "output_uri",
    "value",
    "error",
    "sent_back_by",
    "revised_by",
    "copied_from",
)

#: The gate fields a compact answer keeps (when set).
GATE_FIELDS = (
    "gate_id",
    "task_id",
    "position",
    "status",
    "decisions",
    "approvers",
    "expires_at",
    "on_expiry",
    "note",
    "agent",
    "budget_step",
    "description",
    "comment",
    "approver",
    "channel",
)

#: The run fields a compact answer keeps (when set), in this order; ``tasks``, ``gates`` and
#: ``costs`` are shaped here. ``next_action`` comes first: a host that cuts a long answer short
#: still shows the call to make.
RUN_FIELDS = (
    "next_action",
    "more_actions",
    "run_id",
    "status",
    "status_kind",
    "existing_run",
    "behind",
    "withheld",
    "error",
    "warnings",
    "budget",
    "children",
    "forked_from",
    "parent",
)


def answer_data(view: RunView) -> dict[str, Any]:
    """The structured content of an answer that is ``view``: the whole view (as JSON) when it was
    built with ``detail="full"``, else its compact form (see the module docstring)."""
    if view.detail == "full":
        whole = view.model_dump(mode="json")
        return {"next_action": whole.pop("next_action"), **whole}
    data = _kept(view.model_dump(mode="json", include=set(RUN_FIELDS), exclude_none=True), RUN_FIELDS)
    prompts = [a.user_prompt for a in (view.next_action, *view.more_actions) if isinstance(a, RunHostTask)]
    data["tasks"] = [_task(task, prompts) for task in view.tasks]
    if view.gates:
        data["gates"] = [_gate(gate) for gate in view.gates]
    costs = _costs(view)
    if costs:
        data["costs"] = costs
    return data


def content_for(view: RunView, sees_content: bool) -> RunView:
    """``view`` as a caller is answered with it: as it is when the caller ``sees_content`` (see
    :meth:`server.identity.Caller.sees_content`), else a copy without the run's content (see the
    module docstring), marked ``withheld``."""
    if sees_content:
        return view
    return view.model_copy(
        update={
            "withheld": True,
            "request": None,
            "request_preview": "",
            "next_action": _action_without_content(view.next_action),
            "more_actions": [_action_without_content(a) for a in view.more_actions],
            "error": _error_without_content(view.error),
            "tasks": [_task_without_content(task) for task in view.tasks],
            "gates": [
                gate.model_copy(
                    update={"comment": None, "description": None if gate.description is None else WITHHELD}
                )
                for gate in view.gates
            ],
        }
    )


def _task_without_content(task: TaskView) -> TaskView:
    """A task without its output (whole, preview, sha256, value) and its errors' messages."""
    attempts = [a.model_copy(update={"error": _error_without_content(a.error)}) for a in task.attempts]
    withheld = {"output": None, "output_preview": None, "output_sha256": None, "value": None}
    return task.model_copy(
        update=withheld | {"error": _error_without_content(task.error), "attempts": attempts}
    )


def _error_without_content(error: ErrorView | None) -> ErrorView | None:
    """A typed error with its code, its message withheld (it may quote an output)."""
    return None if error is None else error.model_copy(update={"message": WITHHELD})


A = TypeVar("A", bound=View)


def _action_without_content(action: A) -> A:
    """A next action without the content it carries: a host task's prompts, an exhausted loop's
    history (which an approve action's ``guards`` quotes)."""
    if isinstance(action, RunHostTask):
        return action.model_copy(
            update={
                "system_prompt": WITHHELD,
                "user_prompt": WITHHELD,
                "instruction": "Someone who may read this run runs this task and resumes it: " + WITHHELD,
            }
        )
    if isinstance(action, Approve) and action.position == "exhausted":
        return action.model_copy(update={"guards": WITHHELD})
    return action


def answer_text(data: dict[str, Any]) -> str:
    """The text content of an answer whose structured content is ``data``: the same JSON, without
    indentation (many hosts show their model only the text)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _task(task: TaskView, prompts: list[str]) -> dict[str, Any]:
    """A task's compact form. A task awaiting the host leaves out ``waits_for``: the answer's
    ``next_action`` (or ``more_actions``) says it, with the call. Outputs travel once: a preview
    that a prompt handed out in this answer carries (the work so far, in the next task's prompt)
    is left out; the task's ``output_chars`` and ``output_uri`` stay."""
    data = _kept(task.model_dump(mode="json", include=set(TASK_FIELDS), exclude_none=True), TASK_FIELDS)
    if task.status == TaskStatus.AWAITING_HOST:
        data.pop("waits_for", None)
    preview = (task.output_preview or "").strip()
    if preview and any(preview in prompt for prompt in prompts):
        del data["output_preview"]
    return data


def _gate(gate: GateView) -> dict[str, Any]:
    """A gate's compact form; ``verified`` only when true (the approver is a token's identity)."""
    data = _kept(gate.model_dump(mode="json", include=set(GATE_FIELDS), exclude_none=True), GATE_FIELDS)
    return data | {"verified": True} if gate.verified else data


def _costs(view: RunView) -> dict[str, Any]:
    """What the run spent, when it spent anything: tokens and dollars (latency and attempt counts
    are telemetry, in the full answer)."""
    totals = view.totals
    spent = {
        "input_tokens": totals.input_tokens,
        "output_tokens": totals.output_tokens,
        "cost_usd": round(totals.cost_usd, 6),
    }
    return spent if any(spent.values()) else {}


def _kept(data: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """``data`` in ``order`` without its empty lists and objects (its nulls are gone already:
    ``exclude_none`` drops the null fields of models at any depth, never a null inside data such
    as a typed ``value`` or an ``output_schema``)."""
    return {key: data[key] for key in order if key in data and data[key] not in ([], {})}


__all__ = [
    "GATE_FIELDS",
    "RUN_FIELDS",
    "TASK_FIELDS",
    "WITHHELD",
    "answer_data",
    "answer_text",
    "content_for",
]
