"""What an agent answers, checked as if a client had sent it: the one place
:mod:`orchestration.workers.mcp_agents` turns a remote's values into values this server records.

A remote run id must be in this server's run-id grammar (:func:`remote_run_id`) and an output
within ``max_output_chars`` (:func:`checked_output`); an answer that breaks a bound is
``agent_answer_refused`` (not retried) and nothing of it is recorded. A remote's refusal of a
delegated start is read back as its own code (:func:`refusal_code`, :func:`ended_code`).
"""

from __future__ import annotations

from typing import Any

from orchestration.chains.schemas import validate_output
from orchestration.core.ids import RUN_ID_PATTERN
from orchestration.errors import InvalidOutput

#: the code of an answer that breaks a bound this server holds remote answers to
ANSWER_REFUSED = "agent_answer_refused"

#: a remote construct-mcp's refusals of a delegated start, which the step fails with as they are
DELEGATION_REFUSALS = frozenset({"delegation_loop", "delegation_depth_exceeded"})


class AgentFailure(Exception):
    """A classified failure inside an agent call: its typed error's code and message (caught by
    :meth:`~orchestration.workers.mcp_agents.AgentWorker.delegate`)."""

    def __init__(self, code: str, message: str, http_status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status


def remote_run_id(value: object, agent: str, tool: str) -> str:
    """The run id ``tool`` of ``agent`` answered, if it is one (``agent_answer_refused`` otherwise)."""
    if isinstance(value, str) and RUN_ID_PATTERN.fullmatch(value):
        return value
    raise AgentFailure(
        ANSWER_REFUSED,
        f"agent {agent}: {tool} answered the run id {repr(value)[:100]}, which is not a run id "
        "(3-80 characters of lowercase letters, digits, '-' and '_'); it was not recorded or followed",
    )


def checked_output(text: str, max_chars: int, agent: str) -> str:
    """``text``, an agent's output, if it is within ``max_chars`` (``agent_answer_refused`` otherwise)."""
    if len(text) > max_chars:
        raise AgentFailure(
            ANSWER_REFUSED,
            f"agent {agent} answered an output of {len(text)} characters; the limit is {max_chars} "
            "(CONSTRUCT_MAX_OUTPUT_CHARS); the output was not recorded",
        )
    return text


def checked_answer(
    text: str, output_schema: dict[str, Any] | None, max_chars: int, agent: str
) -> tuple[str, dict[str, Any] | None]:
    """An agent's answer as the step's output and, for a step with an ``output_schema``, its
    validated value: ``agent_answer_refused`` over ``max_chars``, ``malformed_response`` when
    empty, ``invalid_output`` when it does not match the schema."""
    checked_output(text, max_chars, agent)
    if output_schema is None:
        if not text.strip():
            raise AgentFailure("malformed_response", f"agent {agent}: the answer is empty")
        return text, None
    try:
        return text, validate_output(output_schema, text)
    except InvalidOutput as exc:
        raise AgentFailure(InvalidOutput.code, exc.message) from None


def ended_code(error: object) -> str:
    """The code a remote run that ended without completing fails the step with, given the run's
    ``error``: a refusal further down the delegation (a loop, too deep) is the step's own, anything
    else is ``agent_run_failed``."""
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and code in DELEGATION_REFUSALS else "agent_run_failed"


def refusal_code(text: str) -> str | None:
    """The code of a construct-mcp's refusal of a delegated start, when a tool error's ``text``
    starts with one (``delegation_loop: ...``); None otherwise."""
    code = text.partition(":")[0].strip()
    return code if code in DELEGATION_REFUSALS else None


__all__ = [
    "ANSWER_REFUSED",
    "DELEGATION_REFUSALS",
    "AgentFailure",
    "checked_answer",
    "checked_output",
    "ended_code",
    "refusal_code",
    "remote_run_id",
]
