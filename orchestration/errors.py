"""The project's exception hierarchy.

Every error a caller can act on carries a stable ``code`` (the tools and the CLI show it) and a
message that says what to do, its next steps as :class:`Hint` parts each channel words its own way
(:func:`rendered`). Driver, filesystem and HTTP errors are translated into it at the adapter edge
(``raise ... from exc``)::

    ConstructError                      code
    ├── InvalidArgument                 invalid_argument   bad input: an id, a field, a value
    ├── InvalidRequest                  invalid_request    a message that is no request this server serves
    │   ├── ForkMismatch                fork_mismatch      a fork's chain changed a step it copies
    │   └── ExportCorrupt               export_corrupt     a run export whose hashes or shape do not match
    ├── RunNotFound                     run_not_found
    │   ├── RunPruned                   run_pruned         deleted by retention; its tombstone remains
    │   └── RunMoved                    run_moved          moved to another store (runs import --move)
    ├── FactNotFound                    fact_not_found     the run's log has no fact with that seq
    ├── InvalidState                    invalid_state      the run's status does not allow this call
    │   └── UpgradeBlocked              upgrade_blocked    moving would reinterpret recorded work
    ├── DelegationRefused               delegation_refused a start through agent delegation is refused:
    │   ├── DelegationLoop              delegation_loop    ... it passed through this server already
    │   └── DelegationDepthExceeded     delegation_depth_exceeded  ... it has more hops than max_depth
    ├── Conflict                        conflict           idempotency key reused, different decision...
    ├── Forbidden                       forbidden          the caller's identity lacks the role (or the run)
    ├── VersionConflict                 version_conflict   a compare-and-swap write lost the race
    ├── UnknownChain                    unknown_chain
    ├── UnknownSpecialist               unknown_specialist
    ├── TooLarge                        too_large          request or output over the configured limit
    ├── ConfigError                     config_error       a bad construct.toml (file, field, problem)
    ├── InvalidOutput                   invalid_output     an answer does not match its step's output schema
    ├── IllegalTransition               illegal_transition a status move the vocabulary forbids (a bug)
    ├── InternalError                   internal_error     a request failed on a server bug (logged)
    ├── LeaseLost                       lease_lost         another worker holds the run
    └── StoreError                      store_error        the store failed (I/O, driver, corruption)
        ├── StoreUnavailable            store_unavailable  cannot reach / open the backend
        └── CorruptRecord               corrupt_record     a stored record cannot be read back
            └── RecordTooNew            record_too_new     ... because a newer version wrote it
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: The most characters of a caller's input an error message quotes (see :func:`quoted`).
QUOTED_CHARS = 100


#: What a next step does, whatever the channel calls it: list the runs, show one, wait for one to
#: move on, start one, answer a host task, decide a gate.
Operation = Literal["list_runs", "show_run", "wait_run", "start_run", "resume_run", "approve_gate"]


@dataclass(frozen=True)
class Hint:
    """A next step a message names, in no channel's words: ``operation`` with the ``arguments``
    the step is given (values known now; a tuple is a choice among them), ``needs`` the arguments
    the caller supplies itself (an output, a model), and ``run_id`` the run it is about when no
    argument names it. ``form`` is how the sentence uses it: ``call`` (an instruction: "call X
    with ..."), ``name`` (a noun: "X with ... shows it"), ``pass`` ("pass model to X") or
    ``choices`` (the values ``arguments`` offers: "decision: approve or reject")."""

    operation: Operation
    arguments: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    run_id: str | None = None
    form: Literal["call", "name", "pass", "choices"] = "call"


#: A channel's words for a hint (see :func:`rendered`).
HintWords = Callable[[Hint], str]


def either(values: Iterable[str]) -> str:
    """``"a, b or c"``: the values, the last joined with "or"."""
    words = list(values)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def call_words(names: Mapping[Operation, tuple[str, tuple[str, ...]]], verb: str = "call ") -> HintWords:
    """The words of a channel that names each operation as a call (``names``: the call of each
    and the arguments it implies) and the arguments by their names, those known now as JSON:
    ``call orchestrate_resume with {"run_id": ...} plus output``, ``pass model to orchestrate_start``,
    ``decision: approve or reject``."""

    def words(hint: Hint) -> str:
        name, implied = names[hint.operation]
        if hint.form == "choices":
            return ", ".join(
                f"{key}: {either(value) if isinstance(value, tuple) else value}"
                for key, value in hint.arguments.items()
            )
        needs = (*implied, *hint.needs)
        if hint.form == "pass":
            return f"pass {' and '.join(needs)} to {name}"
        said = f"{verb}{name}" if hint.form == "call" else name
        if hint.arguments:
            said += " with " + json.dumps(dict(hint.arguments))
        if needs:
            said += (" plus " if hint.arguments else " with ") + " and ".join(needs)
        return said

    return words


#: The neutral words (logs, and a message quoted inside another or shown on a page).
neutral_words = call_words(
    {
        "list_runs": ("list the runs", ()),
        "show_run": ("the run's status", ()),
        "wait_run": ("the run's status", ("a wait",)),
        "start_run": ("a start", ()),
        "resume_run": ("resume the run", ()),
        "approve_gate": ("decide the gate", ()),
    },
    verb="",
)


@dataclass(frozen=True)
class Said:
    """A message as text and :class:`Hint` parts, in order; ``str + Said`` and ``Said + str``
    are a ``Said``, so a message is built as a string is."""

    parts: tuple[str | Hint, ...] = ()

    def __add__(self, other: str | Said) -> Said:
        return Said(self.parts + (other.parts if isinstance(other, Said) else (other,)))

    def __radd__(self, other: str) -> Said:
        return Said((other, *self.parts))

    def __bool__(self) -> bool:
        return bool(self.parts)

    def rendered(self, words: HintWords) -> str:
        return "".join(part if isinstance(part, str) else words(part) for part in self.parts)

    def hints(self) -> tuple[Hint, ...]:
        return tuple(part for part in self.parts if isinstance(part, Hint))


def hint(
    operation: Operation,
    arguments: Mapping[str, str | tuple[str, ...]] | None = None,
    *,
    needs: tuple[str, ...] = (),
    run_id: str | None = None,
    form: Literal["call", "name", "pass", "choices"] = "call",
) -> Said:
    """A message part that is one :class:`Hint`: ``"...; " + hint("list_runs") + " to see ..."``."""
    return Said((Hint(operation, dict(arguments or {}), needs, run_id, form),))


class ConstructError(Exception):
    """Base of every error this project raises on purpose. Its message is a string, or a
    :class:`Said` whose hints each channel renders in its words (:func:`rendered`)."""

    code = "error"

    def __init__(self, message: str | Said) -> None:
        self.said = message if isinstance(message, Said) else Said((message,))
        text = self.said.rendered(neutral_words)
        super().__init__(text)
        self.message = text

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ConstructError):
    code = "invalid_argument"


class InvalidRequest(ConstructError):
    """A JSON-RPC message that is no request this server can serve: not JSON, a batch, an id that
    is no string or integer, a method that is no string or that the server does not have."""

    code = "invalid_request"


class ForkMismatch(InvalidArgument):
    """A fork's chain (changed, or re-read from the configuration) lacks a step whose recorded
    output the fork copies, or defines it differently (see :mod:`orchestration.ops.forking`)."""

    code = "fork_mismatch"


class RunNotFound(ConstructError):
    code = "run_not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"no run with id {run_id!r} in this store; " + hint("list_runs") + " to see the runs that exist"
        )
        self.run_id = run_id


class RunPruned(RunNotFound):
    """The run was deleted by retention (``runs prune``): the store keeps its tombstone (status,
    times, idempotency key, archive file), so a load says so instead of ``run_not_found``, and a
    start retried with its idempotency key is refused instead of starting it again. A
    ``RunNotFound``: everything that copes with a vanished run copes with it."""

    code = "run_pruned"

    def __init__(self, run_id: str, message: str) -> None:
        ConstructError.__init__(self, message)
        self.run_id = run_id


class RunMoved(RunNotFound):
    """The run was moved out of this store into another (``runs import --move``): this store keeps
    only its tombstone, which names the target, and never drives or changes the run again."""

    code = "run_moved"

    def __init__(self, run_id: str, message: str) -> None:
        ConstructError.__init__(self, message)
        self.run_id = run_id


class ExportCorrupt(InvalidArgument):
    """A run export (``runs export``) that cannot be imported as it is: its hashes do not match its
    lines (changed or truncated after export), or its lines are not a run. Nothing is written."""

    code = "export_corrupt"


class FactNotFound(ConstructError):
    code = "fact_not_found"

    def __init__(self, run_id: str, seq: int) -> None:
        super().__init__(f"run {run_id} has no fact {seq}; its facts are numbered 1 to its head's last_seq")
        self.run_id = run_id
        self.seq = seq


class InvalidState(ConstructError):
    code = "invalid_state"


class UpgradeBlocked(InvalidState):
    """A run cannot move to the chain asked for: a step with recorded work is not in it, or is
    defined differently (see :mod:`orchestration.core.upgrades`). The run stays on its chain."""

    code = "upgrade_blocked"


class DelegationRefused(ConstructError):
    """A start that arrived through agent delegation (its ``_meta`` names the hops and servers it
    passed: :mod:`orchestration.core.hops`) and must not start a run."""

    code = "delegation_refused"


class DelegationLoop(DelegationRefused):
    """The delegation already passed through this server: its agent is itself, or a cycle."""

    code = "delegation_loop"


class DelegationDepthExceeded(DelegationRefused):
    """The delegation has more hops than the started chain's ``max_depth`` allows."""

    code = "delegation_depth_exceeded"


class Conflict(ConstructError):
    code = "conflict"


class Forbidden(ConstructError):
    """The caller is authenticated but may not do this: its identity lacks the role the call needs,
    or the call names a run it may not see. The message names the identity and the role that would
    be needed, never a token."""

    code = "forbidden"


class VersionConflict(ConstructError):
    code = "version_conflict"

    def __init__(self, run_id: str, expected: int, actual: int | None) -> None:
        super().__init__(
            f"run {run_id} changed concurrently (expected version {expected}, found {actual}); "
            "re-read the run and try again"
        )
        self.run_id = run_id
        self.expected = expected
        self.actual = actual


class UnknownChain(ConstructError):
    code = "unknown_chain"


class UnknownSpecialist(ConstructError):
    code = "unknown_specialist"


class TooLarge(ConstructError):
    code = "too_large"


class ConfigError(ConstructError):
    code = "config_error"

    def __init__(self, file: str, field: str, problem: str) -> None:
        super().__init__(f"{file}: {field}: {problem}")
        self.file = file
        self.field = field
        self.problem = problem


class InvalidOutput(ConstructError):
    """An answer for a step with an ``output_schema`` is not JSON or does not match the schema. The
    message says what is wrong and where (a JSON pointer), quoting little of the answer. Nothing is
    recorded: the host corrects its answer and calls again (a provider attempt records the failure
    under the same code, and the next attempt is told what was wrong)."""

    code = "invalid_output"


class IllegalTransition(ConstructError):
    code = "illegal_transition"


class InternalError(ConstructError):
    """A request failed in a way no caller can fix (a bug): the server's log has the traceback."""

    code = "internal_error"


class LeaseLost(ConstructError):
    code = "lease_lost"


class StoreError(ConstructError):
    code = "store_error"


class StoreUnavailable(StoreError):
    code = "store_unavailable"


class CorruptRecord(StoreError):
    code = "corrupt_record"

    def __init__(self, run_id: str, where: str, problem: str) -> None:
        super().__init__(f"run {run_id}: {where} cannot be read: {problem}")
        self.run_id = run_id
        self.where = where


class RecordTooNew(CorruptRecord):
    """A stored record written in a newer record format than this code reads (by a newer version
    of the server: a rolling upgrade, or a rollback). ``record_format`` is the format the record
    states, ``supported_format`` the newest this code reads; ``fact_type`` is set when the record
    is a fact whose type this code does not know.

    A ``CorruptRecord`` on purpose: everything that leaves an unreadable run alone (a drive sets it
    aside, lists skip it, the dispatcher moves on) does the same for it, since it must neither be
    decided from nor written over; its own code and message tell an operator nothing is damaged."""

    code = "record_too_new"

    def __init__(
        self,
        run_id: str,
        where: str,
        record_format: int,
        supported_format: int,
        fact_type: str | None = None,
    ) -> None:
        if fact_type is None:
            why = f"it was written in record format {record_format}"
        else:
            why = f"its fact type {fact_type[:60]!r} (record format {record_format}) is unknown here"
        super().__init__(
            run_id,
            where,
            f"{why}, and this server reads record formats up to {supported_format}: a newer "
            "version of construct-mcp wrote it. The run is left as it is: leave it to a server of "
            "the newer version, or upgrade this one",
        )
        self.record_format = record_format
        self.supported_format = supported_format
        self.fact_type = fact_type


def quoted(value: object, limit: int = QUOTED_CHARS) -> str:
    """``repr(value)`` for an error message that names a caller's input, cut to ``limit``
    characters: a message never echoes a huge (or hostile) input back. A cut string says how long
    it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:limit]}...{size}"


def rendered(exc: ConstructError, words: HintWords) -> str:
    """``exc``'s message with its hints in a channel's ``words``."""
    return exc.said.rendered(words)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when one of ``known`` is close to the misspelled ``name``, else
    ``""``: the hint every unknown-name error gives (tools, arguments, settings, chain fields)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: A validator's words for an input's type (``input`` of an error), in a config file's words.
_TYPE_NAMES = {
    str: "a string",
    bool: "a boolean",
    int: "a whole number",
    float: "a number",
    list: "a list",
    dict: "a table",
}

#: pydantic error types -> what the value must be, in plain words (``{...}`` from the error's ctx).
_MUST_BE = {
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "set_type": "must be a list",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "missing": "is required",
    "literal_error": "must be {expected}",
    "enum": "must be {expected}",
    "greater_than": "must be more than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "string_too_short": "must have at least {min_length} characters",
    "string_too_long": "must have at most {max_length} characters",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
    "string_pattern_mismatch": "must match the pattern {pattern}",
}


def plain_problem(error: Mapping[str, Any]) -> str:
    """One validation error (a pydantic error dict: ``type``, ``msg``, ``ctx``, ``input``) in a
    config file's words: ``must be a whole number (it is a string)``, never the validator's own
    phrasing ("Input should be ...", "Value error, ..."). The value itself is never repeated (it
    may be a secret); its type is."""
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    template = _MUST_BE.get(kind)
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        template = "must not be empty"
    if template is not None:
        try:
            said = template.format(**ctx)
        except (KeyError, IndexError):
            said = template.split(" {", 1)[0]
        given = _TYPE_NAMES.get(type(error.get("input")))
        if kind in ("literal_error", "enum") and isinstance(error.get("input"), str):
            said += did_you_mean(error["input"], re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
        if kind.endswith(("_type", "_parsing")) and given is not None and kind != "missing":
            said += f" (it is {given})"
        return said
    message = str(error.get("msg", "is not valid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    for validator, plain in (("Input should be ", "must be "), ("Input should have ", "must have ")):
        if message.startswith(validator):
            message = plain + message.removeprefix(validator)
    return message[:1].lower() + message[1:] if message[:2] != message[:2].upper() else message
