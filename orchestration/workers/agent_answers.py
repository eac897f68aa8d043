"""What an agent answers, checked as if a client had sent it: the one place
:mod:`orchestration.workers.mcp_agents` turns a remote's values into values this server records.

A remote agent is another party: whatever it answers is bounded and checked before any of it is
recorded, as the tools check what a client sends.

* **Remote run ids** (``orchestrate_start``'s answer, recorded as ``remote_run_started`` and sent
  back in every ``run_status`` that follows the run) must be run ids of the grammar this server's
  own ids have (:data:`~orchestration.core.ids.RUN_ID_PATTERN`: 3-80 characters of ``a-z0-9_-``,
  no path separator, no ``..``): :func:`remote_run_id`.
* **Outputs** (a remote run's task output, a plain tool's text) are at most ``max_output_chars``,
  the bound a host's output has (``CONSTRUCT_MAX_OUTPUT_CHARS``): :func:`checked_output`.
* **What an error message quotes** (a tool's error text, a remote run's error) is bounded where
  every attempt's message is, by the :class:`~orchestration.workers._redact.Redactor`
  (:data:`~orchestration.workers._redact.MAX_MESSAGE_CHARS`).

An answer that breaks a bound is an ``agent_answer_refused`` error (:data:`ANSWER_REFUSED`; not retried:
the same remote answers the same way), and nothing of it is recorded — no ``remote_run_started``
for a bad id, no output — only the attempt's typed error. ``malformed_response`` stays what it was:
an answer of the wrong shape (not a run view, an empty answer).

A remote construct-mcp's refusal of a delegated start (``delegation_loop: ...``,
``delegation_depth_exceeded: ...``; see :mod:`orchestration.core.hops`) is read from the tool
error's text (:func:`refusal_code`), and from the error of a remote run that failed because a start
further down was refused (:func:`ended_code`): the step fails with that code, not retried, instead
of a bare ``tool_error`` or ``agent_run_failed``.
"""

from __future__ import annotations

from orchestration.core.ids import RUN_ID_PATTERN

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
    "checked_output",
    "ended_code",
    "refusal_code",
    "remote_run_id",
]
