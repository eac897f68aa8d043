"""What a run view asks of its caller, its ``next_action`` field (:func:`next_step`): the first
thing that waits, or wait, or nothing, and, for a parallel run whose branches wait at once,
``more_actions`` (every other host task and gate, each with its exact call).

Each action carries its call as data: ``tool`` (a tool name) and ``arguments`` (a JSON object a
host sends to that tool as it is), so that no one has to rebuild a call from a sentence. What the
caller decides is listed apart: a host task's ``add`` names the argument its model's answer goes
in (``output``), a gate's ``choices`` says what each value of ``decision`` does (``arguments`` holds
``approve``). ``instruction`` says in words what to do with them.
Built from a :class:`~orchestration.engine.reading.RunSnapshot` only; :mod:`server.views.run_view`
puts them in the view."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from orchestration.chains import TaskPrompt
from orchestration.core import (
    AGENT_APPROVER,
    GateState,
    RunHead,
    RunStatus,
    gate_approvers,
    parked_question,
    revise_offered,
)
from orchestration.engine import RunSnapshot
from server.views.graph_view import loop_history
from server.views.outline import View


class RunHostTask(View):
    """The run waits for the host's own model to do one task: send ``arguments`` plus ``output``
    (the model's answer, see ``add``) to ``tool``."""

    kind: Literal["run_host_task"] = "run_host_task"
    tool: Literal["orchestrate_resume"] = "orchestrate_resume"
    arguments: dict[str, Any] = Field(description="run_id and task_id; add output (see add).")
    add: dict[str, str] = Field(description="The argument to add to arguments, with what goes in it.")
    task_id: str
    specialist: str
    system_prompt: str
    user_prompt: str
    output_schema: dict[str, Any] | None = Field(
        default=None,
        description="When set, the output must be one JSON object matching this JSON Schema.",
    )
    instruction: str
    run_id: str | None = Field(
        default=None,
        description="Set when this waits in a child run of the run viewed (arguments name it too).",
        exclude_if=lambda v: v is None,  # absent unless set: answers stay as they were
    )


class Approve(View):
    """The run waits at an approval gate: send ``arguments`` to ``tool``, with ``decision`` set to
    the user's choice (one of ``choices``)."""

    kind: Literal["approve"] = "approve"
    tool: Literal["orchestrate_approve"] = "orchestrate_approve"
    arguments: dict[str, Any] = Field(
        description="run_id, gate_id, decision (approve), approver at an agent's gate; set decision."
    )
    choices: dict[str, str] = Field(description="The decisions the gate takes now, each with what it does.")
    gate_id: str
    task_id: str
    position: Literal["before", "after", "exhausted", "budget", "question"]
    guards: str = Field(description="What the gate guards, in one sentence.")
    instruction: str
    run_id: str | None = Field(
        default=None,
        description="Set when this waits in a child run of the run viewed (arguments name it too).",
        exclude_if=lambda v: v is None,  # absent unless set: answers stay as they were
    )


class Wait(View):
    """The run needs nothing from the caller: whoever holds its lease drives it (or it waits
    durably until ``not_before``); see :mod:`server.views.attendance` for a run nobody drives."""

    kind: Literal["wait"] = "wait"
    tool: Literal["run_status"] = "run_status"
    arguments: dict[str, Any] = Field(description="run_id and wait_seconds: waits for the next step.")
    # Absent unless set: the call it carries now costs what a null used to.
    not_before: datetime | None = Field(default=None, exclude_if=lambda v: v is None)
    instruction: str


class Done(View):
    """The run has ended; nothing more can happen to it. It names no call: a host that makes every
    call an answer names would otherwise call again and again, each answer naming the same call.
    Its instruction says how to read an output whole, should the user ask for one."""

    kind: Literal["none"] = "none"
    instruction: str


NextAction = Annotated[RunHostTask | Approve | Wait | Done, Field(discriminator="kind")]


def _gate_guards(gate: GateState, snapshot: RunSnapshot) -> str:
    head = snapshot.head
    step = head.step_of(gate.task_id)
    if gate.position == "exhausted":
        return loop_history(snapshot, gate)
    if gate.position == "budget":
        return (
            f"The budget does not allow the next call: {gate.note} Approving raises that budget by "
            "budget_raise (default: the original budget again); rejecting ends the run."
        )
    if gate.position == "question":
        return (
            f"Agent {gate.agent} (step {step.name!r}) asks: {gate.note} Approving sends comment to "
            "the agent as the answer (required); rejecting declines, and the step fails."
        )
    if gate.position == "before":
        return (
            f"Approval before the {step.name!r} step ({step.specialist}) starts; the earlier tasks' "
            "outputs are previewed in tasks[]; run_status with detail='full' shows them whole."
        )
    return (
        f"Approval of the output of the {step.name!r} step ({step.specialist}) before the chain goes on; "
        f"run_status with task_id={gate.task_id!r} shows that output whole."
    )


TYPED_INSTRUCTION = (
    " This task's answer is typed: output must be only a JSON object that matches output_schema (no "
    "prose around it); one that does not match is refused with invalid_output saying what is wrong, "
    "and nothing is recorded, so fix it and call again."
)


def resume_call(run_id: str, task_id: str) -> dict[str, Any]:
    """The arguments of the ``orchestrate_resume`` call that answers host task ``task_id``, but
    for its ``output``."""
    return {"run_id": run_id, "task_id": task_id}


#: How long the ``run_status`` call a wait names blocks: within what clients that give up on a
#: call after 5 s allow, as the waiting tools' default does; the call is read-only,
#: so a host repeats it until the run needs it, with progress meanwhile.
WAIT_CALL_SECONDS = 3


def wait_call(run_id: str) -> dict[str, Any]:
    """The arguments of the ``run_status`` call that waits for the run's next step."""
    return {"run_id": run_id, "wait_seconds": WAIT_CALL_SECONDS}


def _host_item(snapshot: RunSnapshot, prompt: TaskPrompt) -> RunHostTask:
    schema = snapshot.head.step_of(prompt.task_id).output_schema
    answer = "your complete answer" if schema is None else "one JSON object matching output_schema"
    return RunHostTask(
        arguments=resume_call(snapshot.head.run_id, prompt.task_id),
        add={"output": answer},
        task_id=prompt.task_id,
        specialist=prompt.specialist,
        system_prompt=prompt.system,
        user_prompt=prompt.user,
        output_schema=schema,
        instruction=(
            "Run system_prompt and user_prompt with your own model now, then call tool with arguments "
            "plus output: your whole answer, recorded verbatim."
            + ("" if schema is None else TYPED_INSTRUCTION)
        ),
    )


#: What each decision does, as an approve action's ``choices`` say it.
_CHOICES = {
    "approve": "go on",
    "reject": "end the run",
    "revise": "redo the work shown, with comment",
}
#: ... and at an agent's question
_ANSWER_CHOICES = {
    "approve": "send comment to the agent as the answer",
    "reject": "decline to answer: the step fails",
}


def _gate_item(snapshot: RunSnapshot, gate: GateState) -> Approve:
    """The approve action of ``gate``. A gate the calling agent may decide (its policy lists
    ``"agent"``: :func:`~orchestration.core.approvals.gate_approvers`) says so, and its arguments
    carry ``approver: "agent"``, so that an autonomous runner sends them as they are; any other
    gate is a person's: ask the user, never decide for them."""
    head = snapshot.head
    decisions = ("approve", "reject", "revise") if revise_offered(head, gate) else ("approve", "reject")
    step = head.step_of(gate.task_id)
    allowed = gate_approvers(head, gate)
    arguments: dict[str, Any] = {"run_id": head.run_id, "gate_id": gate.gate_id, "decision": "approve"}
    persons = [a for a in allowed or () if a != AGENT_APPROVER]
    if allowed is not None and AGENT_APPROVER in allowed:
        arguments["approver"] = AGENT_APPROVER
        instruction = (
            "You may decide this gate yourself: call tool with arguments (decision: one of choices; "
            "comment: why)."
        )
        if persons:
            instruction += f" So may {', '.join(persons)}."
    elif gate.position == "question":
        instruction = (
            "Ask the user the agent's question (guards), then call tool with arguments, decision: "
            "approve with comment: their answer, or reject if they decline. Never answer for them."
        )
    else:
        instruction = (
            "Ask the user, then call tool with arguments, decision: their choice, comment: optional "
            "note. Never decide for them."
        )
        if persons:
            instruction += f" Only {', '.join(persons)} may decide this gate."
    if gate.expires_at is not None:
        expires = gate.expires_at.isoformat()
        instruction += f" Undecided at {expires}, it is decided by expiry ({step.on_expiry})."
    return Approve(
        arguments=arguments,
        choices={d: (_ANSWER_CHOICES if gate.position == "question" else _CHOICES)[d] for d in decisions},
        gate_id=gate.gate_id,
        task_id=gate.task_id,
        position=gate.position,
        guards=_gate_guards(gate, snapshot),
        instruction=instruction,
    )


def waiting_items(snapshot: RunSnapshot) -> list[RunHostTask | Approve]:
    """Everything that waits for the caller, in run order: each task awaiting the host (with its
    prompts), then each gate awaiting a decision. A linear run has at most one; a parallel run
    may have several (its branches wait at once)."""
    head = snapshot.head
    if head.status.is_terminal:
        return []
    prompts = snapshot.host_tasks or ((snapshot.host_task,) if snapshot.host_task is not None else ())
    items: list[RunHostTask | Approve] = [_host_item(snapshot, p) for p in prompts]
    items += [_gate_item(snapshot, g) for g in head.gates if g.status == "requested" and _open(head, g)]
    return items


def _open(head: RunHead, gate: GateState) -> bool:
    """Whether a requested gate waits: a question waits while its task is parked at it (a task
    that failed meanwhile, out of time, leaves it undecided and moot)."""
    return gate.position != "question" or parked_question(head.task(gate.task_id)) == gate.gate_id


def next_step(
    snapshot: RunSnapshot, waiting: list[RunHostTask | Approve] | None = None
) -> RunHostTask | Approve | Wait | Done:
    """What the caller does now: the first of :func:`waiting_items` when the run is paused (the
    others are the view's ``more_actions``), else wait or nothing. ``waiting``: those items, when
    the caller has them already."""
    head = snapshot.head
    run_id = head.run_id
    if head.status.is_terminal:
        return Done(
            instruction=f"The run is {head.status.value}; nothing more will happen: report the outcome "
            "to the user and make no more calls for it. Should the user ask for a task's whole output: "
            f"run_status with run_id {run_id!r} and that task_id.",
        )
    if head.status in (RunStatus.AWAITING_HOST, RunStatus.AWAITING_APPROVAL):
        items = waiting_items(snapshot) if waiting is None else waiting
        if head.status == RunStatus.AWAITING_APPROVAL:
            items = [i for i in items if isinstance(i, Approve)] + [
                i for i in items if isinstance(i, RunHostTask)
            ]
        if items:
            return items[0]
    not_before = head.not_before
    if head.status == RunStatus.AWAITING_AGENT:
        return Wait(
            arguments=wait_call(run_id),
            instruction=(
                "The run waits for its agent's remote run, which the server follows (it may wait for "
                "a person there): run_status with arguments waits; nothing is needed from you."
            ),
        )
    return Wait(
        arguments=wait_call(run_id),
        not_before=not_before,
        instruction=(
            f"Status {head.status.value}"
            + (f", next attempt not before {not_before.isoformat()}" if not_before else "")
            + ": the process holding its lease drives it, or a server on its store once a stopped "
            "driver's lease lapses: run_status with arguments waits."
        ),
    )


__all__ = [
    "TYPED_INSTRUCTION",
    "Approve",
    "Done",
    "NextAction",
    "RunHostTask",
    "Wait",
    "next_step",
    "resume_call",
    "wait_call",
    "waiting_items",
]
