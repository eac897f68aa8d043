"""What the ``runs`` commands print for a person: a run (its status, the next action with the one
command that continues it, the gates' legend), a page of runs; or the JSON of either with ``--json``.

The next action comes last, where the eye lands when the command returns. A host task's prompts
(often 70 lines and more) are written to a file whose path is printed (:class:`HostPrompts`:
``<home>/prompts/RUN_ID/TASK_ID.md``), not into the terminal; ``--show-prompt`` prints them too,
before the ``next:`` line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from orchestration.core import RunStatus
from server.views.attendance import said
from server.views.listing import RunsPage
from server.views.next_step import Approve, Done, RunHostTask, Wait
from server.views.run_view import BehindView, ChainView, GateView, RunView
from server.views.timeline import decided_by

#: the statuses of a run that has ended
_ENDED = frozenset(s.value for s in RunStatus if s.is_terminal)


@dataclass(frozen=True, slots=True)
class HostPrompts:
    """Where :func:`print_view` puts a host task's prompts: a file under ``directory`` (its path
    printed; None: no file), and printed whole too when ``show`` (``--show-prompt``)."""

    directory: Path | None = None
    show: bool = False

    def place(self, run_id: str, task_id: str, text: str) -> str:
        """Write ``text`` to the task's prompt file; what to print about where it is."""
        if self.directory is None:
            return ""
        path = self.directory / run_id / f"{task_id.replace('/', '_')}.md"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, "utf-8")
        except OSError as exc:
            return f"  (its prompt could not be written to {path}: {exc.strerror}; --show-prompt prints it)\n"
        lines = text.count("\n")
        return f"  its prompt ({lines} lines): {path}\n"


def print_view(view: RunView, out: TextIO, prompts: HostPrompts | None = None) -> None:
    """The run for a person, its next action last (``prompts``: where a host task's prompts go;
    None: printed whole, before the next action)."""
    prompts = prompts if prompts is not None else HostPrompts(show=True)
    parallel = any(s.after is not None for s in view.chain.steps)
    gated = any(s.approve_before or s.approve_after for s in view.chain.steps)
    steps = (", " if parallel else " -> ").join(
        s.name
        + ("*" if s.approve_before or s.approve_after else "")
        + (f" [{s.route_on}: {', '.join(f'{v}->{t}' for v, t in s.routes.items())}]" if s.routes else "")
        + (f" (after {', '.join(s.after)})" if s.after else "")
        for s in view.chain.steps
    )
    out.write(f"run {view.run_id}: {view.status.value} ({view.status_kind})\n")
    legend = "   (* = approval gate)" if gated else ""  # said only where a * is shown
    version = "" if view.chain.version is None else f" {_version(view.chain)}"
    out.write(f"chain {view.chain.name}{version}: {steps}{legend}\n")
    request = view.request_preview.replace("\n", " ")
    out.write(f"request: {request}\n")
    if view.forked_from is not None:
        out.write(f"forked from {view.forked_from.run_id} at task {view.forked_from.task_id}\n")
    out.write("tasks:\n")
    for task in view.tasks:
        executor = task.executor or "-"
        size = f"{task.output_chars} chars" if task.output_chars is not None else ""
        error = f" error={task.error.code}: {task.error.message}" if task.error else ""
        error += " (copied)" if task.copied_from is not None else ""
        out.write(
            f"  {task.task_id:<14} {task.status.value:<14} {executor:<14} attempts={len(task.attempts)} "
            f"{size}{error}\n".rstrip()
            + "\n"
        )
    for task in view.tasks:
        if task.output is not None:
            out.write(
                f"--- {task.task_id} output ({len(task.output)} chars) ---\n{task.output.rstrip()}\n---\n"
            )
    for route in view.routes:
        bound = f" (bound reached; on_exhausted {route.applied})" if route.exhausted else ""
        went = route.next_task_id or route.applied
        out.write(f"route {route.task_id}: {route.route_on}={route.value} -> {route.target}{bound}: {went}\n")
    for gate in view.gates:
        who = decided_by(gate.approver, gate.channel, gate.verified)
        when = f" at {gate.decided_at:%Y-%m-%d %H:%M:%S}Z" if gate.decided_at else ""
        note = f" ({gate.comment})" if gate.comment else ""
        out.write(f"gate {gate.gate_id}: {gate.status}{who}{when}{note}\n")
    if view.error is not None:
        out.write(f"error: {view.error.code}: {view.error.message}\n")
    for warning in view.warnings:
        out.write(f"warning: {warning}\n")
    if view.behind is not None:
        out.write(_behind(view.run_id, _version(view.chain), view.behind) + "\n")
    if view.more_actions:  # before the next action, which stays last
        out.write(f"\nalso waiting now ({len(view.more_actions)} more, parallel steps; any order):\n")
        for more in view.more_actions:
            _print_action(view, more, out, prompts)
    _print_action(view, view.next_action, out, prompts)


def _version(chain: ChainView) -> str:
    """A chain version as a person reads it: ``v3 (2026.1)``, or the start of its hash."""
    if chain.version is None:
        return chain.hash[:12]
    return f"v{chain.version}" + ("" if chain.label is None else f" ({chain.label})")


def _behind(run_id: str, version: str, behind: BehindView) -> str:
    """The line that says the run's chain has a newer version, and what moving it would do."""
    newer = f"{behind.current_version} (upgrade = {behind.upgrade})"
    said = f"chain: version {version}; the configuration's is {newer}"
    if behind.verdict == "would_move":
        return f"{said}; `construct-mcp runs upgrade {run_id}` moves it"
    return f"{said}; the run stays: {behind.reason}"


def _print_action(
    view: RunView, action: RunHostTask | Approve | Wait | Done, out: TextIO, prompts: HostPrompts
) -> None:
    if action.kind == "run_host_task":
        text = (
            "--- system prompt ---\n" + action.system_prompt.rstrip() + "\n"
            "--- user prompt ---\n" + action.user_prompt.rstrip() + "\n---\n"
        )
        where = prompts.place(view.run_id, action.task_id, text)
        if prompts.show:
            out.write("\n" + text)
        out.write(f"\nnext: run host task {action.task_id!r} ({action.specialist}) with your model")
        out.write(" on its prompt, then\n" if where else ", then\n")
        out.write(where)
        out.write(
            f"  construct-mcp runs resume {view.run_id} --task-id {action.task_id} --output-file ANSWER.md\n"
        )
    elif action.kind == "approve":
        gate = next((g for g in view.gates if g.gate_id == action.gate_id), None)
        out.write(f"\nnext: decide gate {action.gate_id}: {_guards(view, action, gate)}\n")
        choices = "[--reject | --revise]" if gate is not None and "revise" in gate.decisions else "[--reject]"
        out.write(
            f"  construct-mcp runs approve {view.run_id} --gate-id {action.gate_id} {choices} "
            "[--comment TEXT]\n"
        )
    elif action.kind == "wait" and view.unattended is not None:
        out.write(f"\nnext: {said(view.unattended)}\n")
    elif action.kind == "wait":
        out.write(f"\nnext: wait — {_working(view, action)}\n")
    else:
        out.write(
            f"\nthe run is {view.status.value}; nothing more will happen. "
            f"`construct-mcp runs status {view.run_id} --full` shows the whole outputs.\n"
        )


def _guards(view: RunView, action: Approve, gate: GateView | None) -> str:
    """What the gate guards, in the CLI's words (the view's ``guards`` names the tools' arguments)."""
    step = next((s for s in view.chain.steps if s.name == action.task_id), None)
    named = f"the {action.task_id!r} step" + (f" ({step.specialist})" if step is not None else "")
    full = f"`construct-mcp runs status {action.run_id or view.run_id} --full`"
    if action.position == "before":
        return f"approval before {named} starts; {full} shows the earlier tasks' outputs whole."
    if action.position == "after":
        return f"approval of the output of {named} before the chain goes on; {full} shows it whole."
    if action.position == "budget":
        note = f"{gate.note} " if gate is not None and gate.note else ""
        return (
            f"the budget does not allow the next call: {note}Approving raises that budget by "
            "--raise-tokens N / --raise-usd X (default: the original budget again); --reject ends the run."
        )
    if action.position == "question":
        return (
            f"{action.guards.split(' Approving ')[0]} Answer with --comment TEXT (sent to the agent); "
            "--reject declines, and the step fails."
        )
    return action.guards  # a loop's bound: its history, in no tool's words


def _working(view: RunView, action: Wait) -> str:
    """What the run is doing while it needs nothing from the person, and how to follow it."""
    if view.status == RunStatus.AWAITING_AGENT:
        doing = "the run waits for its agent's remote run, which the server follows"
    elif view.status == RunStatus.AWAITING_CHILDREN:
        live = [c.run_id for c in view.children if c.status not in _ENDED]
        doing = "its child runs are working" + (f" ({', '.join(live)})" if live else "")
    else:
        later = f", next attempt not before {action.not_before.isoformat()}" if action.not_before else ""
        doing = f"a process that holds its lease drives it (status {view.status.value}{later})"
    return f"{doing}; `construct-mcp runs tail {view.run_id}` follows it."


def _print_page(page: RunsPage, out: TextIO, where: str | None) -> None:
    width = max((len(run.run_id) for run in page.runs), default=0)
    if not page.runs:
        out.write("no runs\n" if where is None else f"no runs in the store {where}\n")
    else:
        out.write(f"{'RUN':<{width}}  {'STATUS':<18} {'CHAIN':<10} REQUEST\n")
    for run in page.runs:
        waiting = f"  waiting for {run.waiting_for}" if run.waiting_for else ""
        if run.unattended is not None:
            nobody = run.unattended
            when = "lease expired" if nobody.lease_expired else "last write"
            waiting = f"  nobody drives it ({when} {nobody.since:%H:%M:%S}Z): {nobody.continue_with}"
        preview = run.request_preview.replace("\n", " ")[:60]
        out.write(f"{run.run_id:<{width}}  {run.status.value:<18} {run.chain:<10} {preview}{waiting}\n")
    if page.next_cursor:
        out.write(f"more: --cursor {page.next_cursor}\n")


def emit(
    model: RunView | RunsPage,
    as_json: bool,
    out: TextIO,
    where: str | None = None,
    prompts: HostPrompts | None = None,
) -> None:
    if as_json:
        out.write(model.model_dump_json(indent=2) + "\n")
    elif isinstance(model, RunView):
        print_view(model, out, prompts)
    else:
        _print_page(model, out, where)


__all__ = ["HostPrompts", "emit", "print_view"]
