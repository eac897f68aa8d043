"""Ask the user at an approval gate, where the host can (MCP elicitation; what the user sees:
docs/approvals.md, the gate form).

Only a caller that may decide the gate and read the run is asked. The answer takes the path of
``orchestrate_approve`` (:func:`take_answer`, channel ``elicitation``), so a duplicated answer
records one decision and a declined form leaves the gate pending. On 2026-07-28 connections the user
answers by a retry of the same call, so only calls whose retry records nothing new ask there; the
retry's ``request_state`` (:class:`AskedGate`) is sealed by the SDK.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
from mcp.server.elicitation import AcceptedElicitation, render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp.types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestration.core import (
    AGENT_APPROVER,
    GATE_STATUS_OF,
    GateState,
    Limits,
    RevisePlan,
    RunHead,
    RunStatus,
    TaskStatus,
    gate_approvers,
    revise_offered,
    revise_plan,
)
from orchestration.engine import RunSnapshot
from orchestration.errors import Conflict, Forbidden, InvalidArgument, InvalidState
from server.identity import Caller
from server.mcp.tool_hints import tool_message
from server.views.next_step import next_step
from server.views.run_view import RunView, output_uri, request_preview

if TYPE_CHECKING:
    from server.mcp.services import Services

#: The decisions the form offers: ``revise`` (re-run the step under review, with the comment) only
#: where the gate can be revised (:class:`RevisableGateForm`).
Choice = Literal["approve", "reject", "revise"]

#: The form shows this many characters of the output under review.
REVIEW_PREVIEW_CHARS = 1500

#: The key of the form in an ``input_required`` answer's ``input_requests``.
FORM_KEY = "construct_gate"

#: The first protocol revision without server-to-client requests (the SDK's own threshold).
INPUT_REQUIRED_VERSION = "2026-07-28"

#: How long a ``request_state`` this server issued is good for: the expiry the SDK seals it with
#: (:mod:`server.app` builds the server with this policy).
STATE_TTL_SECONDS = 600.0

#: A form refused (declined or cancelled) sooner than this after it was sent was refused by the host
#: itself, before anybody could have read it: the form shows a gate, what comes next and up to
#: 1,500 characters under review, which no one reads, let alone decides on, in under a second and a
#: half; headless hosts answer within milliseconds (Claude Code ``-p`` cancels, Codex ``exec``
#: declines). Such a refusal is reported as the host's, not as the user's choice.
FORM_READ_SECONDS = 1.5

_DID = {"decline": "declined", "cancel": "cancelled", "accept": "accepted"}
_NOTES_KEPT = 5
_NOTE_CHARS = 400


#: The form's own title and description, which hosts show the user: plain sentences (the models'
#: docstrings, which pydantic would publish instead, are written for developers).
FORM_TITLE = "Your decision at this gate"
FORM_DESCRIPTION = "Approve, or reject, the step this gate holds; a comment is optional."
REVISABLE_FORM_DESCRIPTION = (
    "Approve, reject, or send the work under review back to be done again; a comment is optional."
)


class GateForm(BaseModel):
    """The form's fields (primitive, as elicitation requires), for a gate that cannot be revised."""

    model_config = ConfigDict(title=FORM_TITLE, json_schema_extra={"description": FORM_DESCRIPTION})

    decision: Literal["approve", "reject"] = Field(
        title="Decision",
        description="approve: the chain goes on; reject: the run ends as rejected.",
    )
    comment: str | None = Field(
        default=None,
        title="Comment",
        max_length=Limits().max_comment_chars,
        description="Optional. An approval's comment is shown to the following steps.",
    )


class RevisableGateForm(BaseModel):
    """The form for a gate that can be revised (:func:`~orchestration.core.routing.revise_offered`)."""

    model_config = ConfigDict(title=FORM_TITLE, json_schema_extra={"description": REVISABLE_FORM_DESCRIPTION})

    decision: Choice = Field(
        title="Decision",
        description="approve: the chain goes on; reject: the run ends as rejected; revise: the work "
        "under review is done again, with your comment.",
    )
    comment: str | None = Field(
        default=None,
        title="Comment",
        max_length=Limits().max_comment_chars,
        description="Optional (for revise: what to change). An approval's comment is shown to the "
        "following steps.",
    )


def form_for(head: RunHead, gate_id: str) -> type[GateForm] | type[RevisableGateForm]:
    """The form the user is shown at ``gate_id``: with revise only where the gate offers it."""
    gate = head.gate(gate_id)
    return RevisableGateForm if gate is not None and revise_offered(head, gate) else GateForm


def gate_request(snapshot: RunSnapshot, gate_id: str) -> ElicitRequest:
    """The form for ``gate_id`` as an elicitation request (:func:`gate_message`, :func:`form_for`):
    what a 2026-07-28 answer's ``input_requests`` carries, and a task's (:mod:`server.mcp.tasks`)."""
    return ElicitRequest(
        params=ElicitRequestFormParams(
            message=gate_message(snapshot, gate_id),
            requested_schema=render_elicitation_schema(form_for(snapshot.head, gate_id)),
        )
    )


def may_decide(head: RunHead, gate_id: str, caller: Caller) -> bool:
    """Whether ``caller`` may be asked at ``gate_id`` (see :func:`_may_decide`), role included."""
    return "approve" in caller.roles and _may_decide(head, gate_id, caller)


def _may_decide(head: RunHead, gate_id: str, caller: Caller) -> bool:
    """Whether the answer of ``caller`` could be recorded at ``gate_id`` by its approvers (the
    form records the verified identity, else nobody): a gate whose policy names approvers
    (:func:`~orchestration.core.approvals.gate_approvers`) is asked only of a person it names, so a
    gate only the agent decides is never asked (the form would record a person's decision). A
    caller who may not read the run's content is not asked either: the form shows the request
    and the output under review (:meth:`~server.identity.Caller.sees_content`)."""
    if not caller.sees_content(head):
        return False
    gate = head.gate(gate_id)
    allowed = gate_approvers(head, gate) if gate is not None else None
    if allowed is None:
        return True
    return caller.verified and caller.identity != AGENT_APPROVER and caller.identity in allowed


@dataclass(frozen=True, slots=True)
class AskedGate:
    """What a ``request_state`` says: the gate asked about, for whom, and the warnings of earlier
    rounds of the same call (so they reach its final answer). Plain JSON: the SDK seals it
    (``mcp.server.request_state``: AES-GCM under a key of this process, bound to the tool, its
    arguments, the token's identity and an expiry of :data:`STATE_TTL_SECONDS`) and hands back only
    a state it sealed, unchanged; the tool still checks that it names the run and the identity of
    the call. A retry that reaches another process, or this one restarted, is refused the same way."""

    run_id: str
    gate_id: str
    identity: str | None
    notes: tuple[str, ...] = ()

    def to_state(self) -> str:
        return json.dumps(
            {"r": self.run_id, "g": self.gate_id, "i": self.identity, "n": self.notes},
            separators=(",", ":"),
        )

    @classmethod
    def from_state(cls, state: str) -> AskedGate:
        """The gate ``state`` names; ``invalid_argument`` when it is not the state of a gate form
        (the SDK hands a tool only a state it sealed, so only a state of another shape is)."""
        try:
            data = json.loads(state)
            return cls(
                run_id=str(data["r"]),
                gate_id=str(data["g"]),
                identity=None if data["i"] is None else str(data["i"]),
                notes=tuple(str(n) for n in data["n"]),
            )
        except (ValueError, KeyError, TypeError):
            raise InvalidArgument(
                "request_state is not one this server issued for a gate form; nothing was recorded. Call "
                "the tool again without it to be asked again, or decide with orchestrate_approve"
            ) from None


ToolContext = Context["Services", Any]


def brought_answer(ctx: ToolContext, caller: Caller, head: RunHead) -> AskedGate | None:
    """On a 2026-07-28 connection, the gate whose form this call's retry answers (its
    ``request_state``), with the notes of earlier rounds; ``invalid_argument`` when the state names
    another run or identity. None when the call brings no answer."""
    if not is_modern(ctx) or ctx.request_state is None:
        return None
    asked = AskedGate.from_state(ctx.request_state)
    if asked.run_id != head.run_id or asked.identity != caller.identity:
        raise InvalidArgument(
            "request_state was issued for another run or identity; nothing was recorded. Call the "
            "tool again without it to be asked again"
        )
    return asked


def brought_response(ctx: ToolContext) -> ElicitResult | None:
    """The user's answer to the form this call's retry brings, if any."""
    response = (ctx.input_responses or {}).get(FORM_KEY)
    return response if isinstance(response, ElicitResult) else None


async def input_required(
    services: Services, view: RunView, caller: Caller, notes: list[str], answered: str | None
) -> InputRequiredResult | None:
    """On a 2026-07-28 connection: the form for the gate the run waits at, as an ``input_required``
    answer whose retry brings the user's answer; None when there is no gate to ask about (none,
    the one just ``answered``, or one ``caller`` may not decide)."""
    gate = open_gate(view)
    if gate is None or gate == answered:
        return None
    snapshot = await services.runtime.snapshot(view.run_id)
    if not _may_decide(snapshot.head, gate, caller):
        return None
    asked = AskedGate(
        run_id=view.run_id,
        gate_id=gate,
        identity=caller.identity,
        notes=tuple(n[:_NOTE_CHARS] for n in notes[-_NOTES_KEPT:]),
    )
    return InputRequiredResult(
        input_requests={FORM_KEY: gate_request(snapshot, gate)}, request_state=asked.to_state()
    )


async def ask_in_call(
    ctx: ToolContext, view: RunView, gate: str, caller: Caller, wait: tuple[float, float], notes: list[str]
) -> RunHead | None:
    """On a handshake-era connection: ask ``caller`` the form for ``gate`` in the middle of the
    call (open for the first of ``wait``, what is left of the call's ``wait_seconds``, the second)
    and record an accepted answer; the run's head after it, or None when the form is not for
    ``caller`` or the user did not accept (a note says why)."""
    services: Services = ctx.request_context.lifespan_context
    snapshot = await services.runtime.snapshot(view.run_id)
    if not _may_decide(snapshot.head, gate, caller):
        return None
    result = await _elicit(ctx, snapshot, gate, wait, notes)
    if result is None:
        return None
    head = await take_answer(services, snapshot.head, gate, result, caller, notes)
    return head if result.action == "accept" else None


async def _elicit(
    ctx: ToolContext, snapshot: RunSnapshot, gate: str, wait: tuple[float, float], notes: list[str]
) -> ElicitResult | None:
    """The user's answer to the form for ``gate``, open for the first of ``wait`` (what is left of
    the call's ``wait_seconds``, the second, which the note names); None (and a note saying why)
    when the form failed or got no answer in time."""
    open_for, wait_seconds = wait
    with anyio.move_on_after(open_for):
        sent = anyio.current_time()
        try:
            outcome = await ctx.elicit(gate_message(snapshot, gate), form_for(snapshot.head, gate))
        except (MCPError, ValueError) as exc:
            notes.append(f"elicitation: the form for gate {gate} failed ({exc}); it is still pending")
            return None
        if isinstance(outcome, AcceptedElicitation):
            return ElicitResult(action="accept", content=outcome.data.model_dump())
        if anyio.current_time() - sent < FORM_READ_SECONDS:
            notes.append(
                f"elicitation: the host {_DID[outcome.action]} the form for gate {gate} at once, before "
                "anybody could read it (it shows no forms to the user); the gate is still pending: ask the "
                "user, then call orchestrate_approve with their decision"
            )
            return None
        return ElicitResult(action=outcome.action)
    notes.append(
        f"elicitation: no answer to the form for gate {gate} within {wait_seconds:g} s; the gate "
        "is still pending"
    )
    return None


async def take_answer(
    services: Services,
    head: RunHead,
    gate_id: str,
    response: ElicitResult | None,
    caller: Caller,
    notes: list[str],
) -> RunHead:
    """Record the user's answer to the form for ``gate_id`` as ``orchestrate_approve`` records a
    decision (channel ``elicitation``; the approver: the HTTP token's verified identity, else nobody,
    claimed); returns the run as it is now."""
    form = _accepted_form(gate_id, response, notes)
    if form is None:
        return head
    caller.require("approve", "deciding a gate")
    runtime = services.runtime
    run_id = head.run_id
    try:
        return await runtime.approve(
            run_id,
            form.decision,
            gate_id,
            form.comment,
            caller.identity if caller.verified else None,
            channel="elicitation",
            verified=caller.verified,
        )
    except Conflict:
        # Decided elsewhere while the form was open (an identical repeat of this answer is no
        # conflict: approve returned above).
        head = await runtime.status(run_id)
        gate = _decided(head, gate_id)
        if gate is None:  # pragma: no cover - approve raises Conflict only for a decided gate
            raise
        notes.append(_decided_elsewhere(gate, form.decision))
        return head
    except (InvalidState, InvalidArgument, Forbidden) as exc:
        said = tool_message(exc)
        notes.append(f"{exc.code}: the answer ({form.decision}) to gate {gate_id} was not recorded: {said}")
        return await runtime.status(run_id)


def _accepted_form(gate_id: str, response: ElicitResult | None, notes: list[str]) -> RevisableGateForm | None:
    """The form the user accepted; None (and a note saying why) when there is no answer to record:
    none, declined, cancelled, or one that does not fit the form."""
    if response is None or response.action != "accept":
        said = "gave no answer to" if response is None else _DID[response.action]
        notes.append(
            f"elicitation: the user {said} the form for gate {gate_id}; the gate is still pending: decide "
            "it with orchestrate_approve when the user has"
        )
        return None
    try:
        return RevisableGateForm.model_validate(response.content or {})
    except ValidationError:
        notes.append(
            f"elicitation: the answer to the form for gate {gate_id} did not fit the form; nothing was "
            "recorded and the gate is still pending"
        )
        return None


def _decided_elsewhere(gate: GateState, decision: Choice) -> str:
    """The note for an answer to ``gate`` that was decided elsewhere while the form was open."""
    by = f" by {gate.approver!r}" if gate.approver else ""
    via = f" via {gate.channel}" if gate.channel else ""
    if gate.status == GATE_STATUS_OF[decision]:
        return (
            f"elicitation: gate {gate.gate_id} was already {gate.status}{by}{via} while the form was open; "
            "the answer agrees, so nothing more was recorded"
        )
    return (
        f"conflict: gate {gate.gate_id} was already {gate.status}{by}{via} while the form was open; the "
        f"answer ({decision}) differs and was not recorded"
    )


def gate_message(snapshot: RunSnapshot, gate_id: str) -> str:
    """The form's text: the run, the gate, what comes next, and the output under review (a
    preview of at most :data:`REVIEW_PREVIEW_CHARS` characters)."""
    head = snapshot.head
    gate = next(g for g in head.gates if g.gate_id == gate_id)
    step = head.step_of(gate.task_id)
    steps = [s.name for s in head.chain.steps]
    lines = [
        f"Run {head.run_id} (chain {head.chain.name!r}: {' -> '.join(steps)}) waits for your decision "
        f"at gate {gate_id}.",
        f"Request: {request_preview(head.request)}",
    ]
    reviewed: str | None
    if gate.position == "exhausted":
        action = next_step(snapshot)
        lines.append(action.guards if action.kind == "approve" else "A loop reached its bound.")
        reviewed = gate.task_id
    elif gate.position == "question":
        lines.append(
            f"Agent {gate.agent} (step {step.name!r}) asks: {gate.note}\nApprove with your answer as the "
            "comment: it is sent to the agent. Reject: you decline, and the step fails."
        )
        reviewed = None
    elif gate.position == "budget":
        lines.append(
            f"The budget does not allow the next call: {gate.note} Approve: the budget is raised by its "
            "original amount again (orchestrate_approve's budget_raise gives another). Reject: the run "
            "ends as rejected."
        )
        reviewed = None
    elif gate.position == "before":
        lines.append(
            f"Approve: the {step.name!r} step ({step.specialist}) starts. Reject: the run ends as rejected."
        )
        reviewed = _last_done_before(head, gate.task_id)
    else:
        index = steps.index(step.name)
        last = index + 1 >= len(steps)
        then = "the run completes" if last else f"the chain goes on with {steps[index + 1]!r}"
        lines.append(f"Approve: {then}. Reject: the run ends as rejected.")
        reviewed = gate.task_id
    plan = revise_plan(head, gate)
    if isinstance(plan, RevisePlan):
        lines.append(f"Revise: {plan.body[0]!r} runs again with your comment (as a new task instance).")
    output = snapshot.outputs.get(reviewed) if reviewed is not None else None
    if reviewed is not None and output is not None:
        cut = output if len(output) <= REVIEW_PREVIEW_CHARS else output[: REVIEW_PREVIEW_CHARS - 1] + "…"
        shown = "all of it" if cut == output else f"the first {REVIEW_PREVIEW_CHARS - 1}"
        lines.append(
            f"Output under review — {reviewed} ({len(output)} characters, {shown}; whole at "
            f"{output_uri(head.run_id, reviewed)}):\n{cut}"
        )
    return "\n\n".join(lines)


def _last_done_before(head: RunHead, task_id: str) -> str | None:
    done: str | None = None
    for task in head.tasks:
        if task.task_id == task_id:
            break
        if task.status == TaskStatus.DONE:
            done = task.task_id
    return done


def is_modern(ctx: ToolContext) -> bool:
    """Whether the connection is of the 2026-07-28 era (no server-to-client requests)."""
    version = ctx.protocol_version
    return version is not None and is_version_at_least(version, INPUT_REQUIRED_VERSION)


def can_ask(ctx: ToolContext, caller: Caller) -> bool:
    """The client declared form elicitation (a bare ``elicitation: {}`` counts, as in the SDK) and
    the caller may decide gates."""
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is None or (elicitation.form is None and elicitation.url is not None):
        return False
    return "approve" in caller.roles


def open_gate(view: RunView) -> str | None:
    """The gate the run waits at, by its view; None when it waits at none."""
    action = view.next_action
    if view.status == RunStatus.AWAITING_APPROVAL and action.kind == "approve":
        return action.gate_id
    return None


def _decided(head: RunHead, gate_id: str) -> GateState | None:
    gate = next((g for g in head.gates if g.gate_id == gate_id), None)
    return gate if gate is not None and gate.status not in ("pending", "requested") else None


def noted(view: RunView, notes: list[str]) -> RunView:
    """``view`` with ``notes`` added to its warnings."""
    if not notes:
        return view
    return view.model_copy(update={"warnings": [*view.warnings, *notes]})
