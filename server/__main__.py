"""``python -m server`` and the ``construct-mcp`` console script. ``construct-mcp serve`` on stdio
answers the host's ``initialize`` (and its first ``tools/list``) before it imports the server
(:mod:`server.transports.handshake`), then runs the command line (:mod:`server.cli.main`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from server.mcp.server_card import (
    CAPABILITIES,
    SERVER_NAME,
    SERVER_TITLE,
    default_tools_list,
    instructions_with,
    server_version,
)
from server.settings.early import early_settings
from server.transports.handshake import EarlyInput, ServerCard, answer_initialize_early

#: ``serve``'s options that take a value, and the values the early answer allows for the ones
#: that are checked (None: any); any other argument leaves ``initialize`` to the server.
_SERVE_OPTIONS: dict[str, frozenset[str] | None] = {
    "--transport": frozenset({"stdio"}),
    "--home": None,
    "--config": None,
    "--store": None,
    "--log-level": frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}),
    "--host": None,
    "--port": None,
}


def stdio_serve_options(argv: Sequence[str]) -> dict[str, str] | None:
    """The options of ``serve`` on stdio in ``argv`` (option -> value), or None when ``argv`` is
    another command, another transport, or anything the command line might refuse (the server then
    answers ``initialize`` itself, after the command line has had its say)."""
    if not argv or argv[0] != "serve":
        return None
    options: dict[str, str] = {}
    rest = list(argv[1:])
    while rest:
        option, joined, value = rest.pop(0).partition("=")
        if option not in _SERVE_OPTIONS or option in options:
            return None
        if not joined:
            if not rest or rest[0].startswith("-"):
                return None
            value = rest.pop(0)
        allowed = _SERVE_OPTIONS[option]
        if (allowed is not None and value not in allowed) or (option == "--port" and not value.isdigit()):
            return None
        options[option] = value
    return options


def inline_card(default_limits: bool = True) -> ServerCard:
    """What is answered early when the worker backend is ``inline`` (instructions without a
    warning), as :meth:`server.app.ConstructApp.build_server` builds the server then; with the
    tools' list when the size limits are the defaults."""
    tools = default_tools_list() if default_limits else None
    return ServerCard(
        SERVER_NAME, SERVER_TITLE, server_version(), instructions_with(None), CAPABILITIES, tools
    )


def answer_early(argv: Sequence[str]) -> EarlyInput | None:
    """For ``serve`` on stdio whose instructions are known without loading the settings: start
    answering ``initialize`` (and ``tools/list``) on stdin (see :mod:`server.transports.handshake`)."""
    options = stdio_serve_options(argv)
    if options is None:
        return None
    sure = early_settings(options.get("--home"), options.get("--config"))
    if not sure.inline:
        return None
    try:
        return answer_initialize_early(inline_card(sure.default_limits))
    except OSError:
        return None  # no stdin or stdout to duplicate: the server meets the same and says so


#: what ``serve`` on stdio says to a person who started it in a terminal (stdin a terminal: no
#: host application is on the other end), on stderr; it serves all the same
TERMINAL_HINT = (
    "construct-mcp serve: this is an MCP server for a host application, which starts it and speaks "
    "JSON-RPC on its stdin and stdout (see docs/hosts.md). To try it by hand, run "
    "'construct-mcp demo'; for the runs page in a browser, 'construct-mcp serve --transport "
    "streamable-http' (http://127.0.0.1:8000/runs). Ctrl-C stops it.\n"
)


def on_stdio(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is ``serve`` on the stdio transport (its default)."""
    if not argv or argv[0] != "serve":
        return False
    for at, arg in enumerate(argv):
        if arg.startswith("--transport="):
            return arg.partition("=")[2] == "stdio"
        if arg == "--transport":
            return argv[at + 1 : at + 2] == ["stdio"]
    return True


def main() -> None:
    argv = sys.argv[1:]
    if on_stdio(argv) and sys.stdin.isatty():
        sys.stderr.write(TERMINAL_HINT)
        sys.stderr.flush()
    answer_early(argv)
    from server.cli.main import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
