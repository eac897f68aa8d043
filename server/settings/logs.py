"""Logging for the server and the CLI: standard ``logging``, to stderr only (over stdio, stdout is the
MCP transport, and one stray line there breaks the host's session). Every record is one line with
its stable ``action`` name first; log lines never carry secrets (URLs are redacted) nor whole
prompts or outputs.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

#: Extras rendered as ``key=value`` after the level and logger name, in this order.
FIELDS = ("action", "run_id", "task_id", "gate_id", "code", "version", "transport", "store", "owner")


class LineFormatter(logging.Formatter):
    """One line per record: time, level, logger, the known extras, then the message."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"{stamp}.{int(record.msecs):03d}Z", record.levelname, record.name]
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                parts.append(f"{name}={value}")
        message = record.getMessage()
        if record.exc_info:
            # Tracebacks stay on stderr but are folded onto the same line, so a log collector
            # that splits on newlines still sees one event.
            message += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        parts.append(message.replace("\n", "\\n"))
        return " ".join(parts)


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record of the process to ``stream`` (stderr), one line each.

    Replaces any handler already on the root logger, so libraries that call
    ``logging.basicConfig`` later (the MCP SDK does, in ``MCPServer.__init__``) find it configured
    and add nothing, in particular nothing that could write to stdout.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(LineFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Per-request chatter from the HTTP stack would drown the events that matter.
    for noisy in ("uvicorn.access", "httpx", "httpcore", "mcp.server.streamable_http_manager"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
