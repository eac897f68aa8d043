"""Each chain of the catalog as an MCP prompt, so hosts offer it as a command: its one argument,
``request``; its text tells the host model to drive the chain with the tools, asking the user at each
gate, never deciding for them. Built from the catalog alone (no run, no clock), so the same request
always renders the same prompt; a ``prompts/get`` it cannot answer is refused with a coded error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mcp.server import MCPServer, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.mcpserver.prompts.base import Prompt, PromptArgument, UserMessage

from orchestration.chains import Catalog, ChainDefinition
from orchestration.core import Limits
from orchestration.errors import ConstructError, InvalidArgument, TooLarge, quoted
from server.mcp.arguments import close_or_all
from server.mcp.protocol_errors import coded

log = logging.getLogger("construct.server")

REQUEST_DESCRIPTION = "What the chain should work on, in your words (the task and its context)."


def chain_prompt_text(chain: ChainDefinition, request: str) -> str:
    """The instructions a chain's prompt gives the host model, ending with the request."""
    steps = " -> ".join(step.name for step in chain.steps)
    gated = [
        f"{'before' if step.approve_before else 'after'} {step.name}"
        for step in chain.steps
        if step.approve_before or step.approve_after
    ]
    gates = f" It pauses for the user's approval {', '.join(gated)}." if gated else ""
    return f"""\
Run the construct-mcp chain "{chain.name}" ({steps}: {chain.description}) on the request below, \
and drive it to its end.{gates}

1. Call orchestrate_start with chain="{chain.name}" and request set to the request below, verbatim. \
Keep the run_id it returns.
2. Then do what each answer's next_action says, until the run has ended:
   Each next_action holds its call: send next_action.arguments to the tool next_action.tool.
   - run_host_task: run its system_prompt and user_prompt with your own model, then make the call \
(orchestrate_resume with the run_id and task_id) with output added: your whole answer.
   - approve: show the user what the gate guards (next_action.guards) and the output under review, \
ask them to choose one of next_action.choices (with a comment if they like), then make the call \
(orchestrate_approve with the run_id and gate_id) with decision set to their choice. Never decide for them.
   - wait: make the call (it waits) until the run needs you again.
   - none: the run has ended; tell the user its status and what the last step produced.
If the conversation is interrupted, run_status with the run_id picks the run up again.

Request:
{request}"""


def chain_prompt(chain: ChainDefinition) -> Prompt:
    """The prompt for one chain."""

    def render(request: str) -> list[UserMessage]:
        return [UserMessage(chain_prompt_text(chain, request))]

    fn: Any = render
    return Prompt(
        name=chain.name,
        title=f"Run the {chain.name} chain",
        description=f"Start the '{chain.name}' chain ({chain.description}) on a request and drive it.",
        arguments=[PromptArgument(name="request", description=REQUEST_DESCRIPTION, required=True)],
        fn=fn,
        context_kwarg=None,
    )


def register_chain_prompts(server: MCPServer[Any], catalog: Catalog) -> None:
    """Add one prompt per chain of ``catalog`` to ``server``."""
    for name in sorted(catalog.chains):
        server.add_prompt(chain_prompt(catalog.chains[name]))


class PromptRefusal:
    """Server middleware: a ``prompts/get`` for no prompt of ``catalog``, or with arguments its
    prompt does not take, is refused before anything is rendered, as the tools refuse their
    arguments: an unknown prompt name (with the closest one), an unknown or missing argument is
    ``invalid_argument``, a request over ``CONSTRUCT_MAX_REQUEST_CHARS`` is ``too_large``, each a
    JSON-RPC invalid-params error whose message starts with the code; nothing is logged as a
    failure. Params of the
    wrong shape are left to the SDK's validation, which :class:`~server.mcp.protocol_errors.CodedErrors`
    codes."""

    def __init__(self, catalog: Catalog, limits: Limits) -> None:
        self.names = sorted(catalog.chains)
        self.max_request_chars = limits.max_request_chars

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "prompts/get" and isinstance(ctx.params, Mapping):
            refusal = self._refusal(ctx.params.get("name"), ctx.params.get("arguments"))
            if refusal is not None:
                log.info("prompts/get refused", extra={"action": "prompt_error", "code": refusal.code})
                raise coded(refusal)
        return await call_next(ctx)

    def _refusal(self, name: object, arguments: object) -> ConstructError | None:
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, Mapping)):
            return None  # the wrong shape: the SDK's validation says so
        if name not in self.names:
            hint = close_or_all(name, self.names, "the prompts are")
            return InvalidArgument(f"unknown prompt {quoted(name)}{hint}")
        given = dict(arguments or {})
        unknown = [key for key in given if key != "request"]
        if unknown:
            said = ", ".join(quoted(str(key)) for key in unknown[:5])
            return InvalidArgument(f"unknown argument {said}; the prompt {name!r} takes: request")
        request = given.get("request")
        if request is None:
            return InvalidArgument(f"request is required: what the chain {name!r} should work on")
        if isinstance(request, str) and len(request) > self.max_request_chars:
            limit = self.max_request_chars
            return TooLarge(f"request is over {limit} characters (CONSTRUCT_MAX_REQUEST_CHARS)")
        return None
