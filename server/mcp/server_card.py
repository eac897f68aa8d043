"""What a host learns of this server when it connects (name, title, version, instructions, capabilities),
importing the standard library only: the stdio transport answers ``initialize`` and the first
``tools/list`` (``tools_list.json`` beside this module) before the SDK is imported, and
``tests/unit/server/test_early_initialize.py`` checks both against the SDK's own answers.
"""

from __future__ import annotations

from pathlib import Path

#: the SDK's ``tools/list`` result (JSON) for the default size limits: see the module docstring
TOOLS_LIST_FILE = Path(__file__).with_name("tools_list.json")

SERVER_NAME = "construct-mcp"
SERVER_TITLE = "construct-mcp: durable specialist chains"

INSTRUCTIONS = """\
construct-mcp runs durable specialist chains (for example architect -> engineer -> reviewer).
Start one with orchestrate_start. Every answer is a run view whose next_action says what to do,
with the call to make: send its arguments to its tool. Its kind is run_host_task (do the task with
your own model, then call the tool with arguments plus output, your answer), approve (ask the user,
then call it with decision set to their choice, one of choices), wait (the call waits) or none
(finished: it names no call; stop). Parallel steps may wait at once: more_actions lists the
others, each like next_action; do them in any order, or at once.
Views show task outputs as previews; run_status(run_id, detail='full') shows them whole.
Runs survive server restarts: keep the run_id and call run_status to pick a run up again."""

#: The capabilities the SDK derives from what :meth:`server.app.ConstructApp.build_server` registers
#: (tools; resources, with ``resources/subscribe``; prompts), as the ``initialize`` answer carries
#: them, in the SDK's order. The SDK advertises the server's extensions only to 2026-07-28
#: clients, which do not send ``initialize``.
CAPABILITIES: dict[str, object] = {
    "prompts": {"listChanged": False},
    "resources": {"listChanged": False, "subscribe": True},
    "tools": {"listChanged": False},
}


def instructions_with(warning: str | None) -> str:
    """The ``instructions``: :data:`INSTRUCTIONS`, and a warning a model must know before it starts
    a run (a provider backend without a key), if there is one."""
    return INSTRUCTIONS if warning is None else f"{INSTRUCTIONS}\nWarning: {warning}."


def default_tools_list() -> str | None:
    """:data:`TOOLS_LIST_FILE`'s result, or None when it cannot be read (then the SDK answers)."""
    try:
        return TOOLS_LIST_FILE.read_text("utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def server_version() -> str:
    """The installed package's version (``serverInfo.version``)."""
    try:
        from importlib.metadata import version

        return version("construct-mcp")
    except Exception:  # pragma: no cover - running from a source tree without metadata
        return "0"


__all__ = [
    "CAPABILITIES",
    "INSTRUCTIONS",
    "SERVER_NAME",
    "SERVER_TITLE",
    "TOOLS_LIST_FILE",
    "default_tools_list",
    "instructions_with",
    "server_version",
]
