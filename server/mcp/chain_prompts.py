"""Each chain of the catalog as an MCP prompt, so hosts offer it as a command (a slash command in
Claude Code and VS Code, the attachment menu in Claude Desktop).

The prompt's name is the chain's name and its one argument, ``request``, is what the chain should
work on. Its text tells the host model to start that chain with ``orchestrate_start`` and drive it
to its end: run each host task with its own model and hand the output back with its ``task_id``,
ask the user at each gate and pass the ``gate_id`` with their decision, never deciding for them.
The text is built from the catalog alone (no run, no clock), so the same chain always renders the
same prompt for the same request.
"""

from __future__ import annotations

from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver.prompts.base import Prompt, PromptArgument, UserMessage

from orchestration.chains import Catalog, ChainDefinition

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
