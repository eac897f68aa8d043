"""The stdio ``initialize`` (and the first ``tools/list``) answered before the MCP SDK is imported.

A host such as Codex CLI leaves out the tools of a server that has not answered within about a
second of its spawn, and importing the SDK takes most of that. :class:`EarlyInput` reads the first
messages with the standard library alone and answers them exactly as the SDK would; the SDK then
serves the same session from its first message, its own answers to those requests dropped.
``tests/unit/server/test_early_initialize.py`` compares the two for every protocol version.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

log = logging.getLogger("construct.server")

#: The protocol versions the MCP SDK negotiates through ``initialize`` (``mcp_types.version``'s
#: ``HANDSHAKE_PROTOCOL_VERSIONS``, oldest first), copied so that answering needs no import of
#: ``mcp_types`` (a third of a second); a test keeps the two the same.
HANDSHAKE_PROTOCOL_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
#: what the SDK answers a client asking for a version it does not negotiate
LATEST_HANDSHAKE_VERSION = HANDSHAKE_PROTOCOL_VERSIONS[-1]

#: How much is read looking for the first message; an ``initialize`` request is far smaller. Past
#: this the bytes are passed on unanswered (the relay bounds lines as for any other input).
FIRST_LINE_LIMIT = 65536
_CHUNK = 65536
#: JSON-RPC ids the SDK writes back exactly as given (an integer it reads as a 64-bit one).
_MAX_ID = 2**63

RequestId = str | int


@dataclass(frozen=True)
class ServerCard:
    """What ``initialize`` tells a host: the server's name, title, version and instructions, and
    its capabilities as the SDK puts them on the wire; and the ``tools/list`` result as the SDK
    writes it (JSON), if it is known (else ``tools/list`` is the server's to answer)."""

    name: str
    title: str
    version: str
    instructions: str
    capabilities: Mapping[str, object]
    tools_list: str | None = None


@dataclass(frozen=True)
class EarlyAnswer:
    """The ``initialize`` request answered early: its id and the line written (without newline)."""

    request_id: RequestId
    line: str


def negotiated_version(requested: str) -> str:
    """The version the SDK answers a client asking for ``requested``."""
    return requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION


def initialize_answer(line: bytes, card: ServerCard) -> EarlyAnswer | None:
    """The answer to ``line`` when it is an ``initialize`` request the SDK surely accepts, as the
    SDK's stdio transport writes it; None for anything else (the SDK then answers it itself)."""
    message = _parsed(line)
    if message is None or set(message) != {"jsonrpc", "id", "method", "params"}:
        return None
    request_id, params = message["id"], message["params"]
    if message["jsonrpc"] != "2.0" or message["method"] != "initialize" or not _plain_id(request_id):
        return None
    if not _accepted_params(params):
        return None
    result = {
        "capabilities": card.capabilities,
        "instructions": card.instructions,
        "protocolVersion": negotiated_version(params["protocolVersion"]),
        "serverInfo": {"name": card.name, "title": card.title, "version": card.version},
    }
    answer = {"jsonrpc": "2.0", "id": request_id, "result": result}
    try:
        text = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
        text.encode("utf-8")  # a lone surrogate in an id cannot be written as the SDK would
    except (TypeError, ValueError):
        return None
    return EarlyAnswer(request_id, text)


def tools_list_answer(line: bytes, result: str) -> EarlyAnswer | None:
    """The answer to ``line`` when it is a ``tools/list`` request for the first page (no params,
    empty ones, or only a progress token, as Codex CLI sends it), with ``result`` (the SDK's, as
    JSON); None for anything else."""
    message = _parsed(line)
    if message is None or set(message) - {"params"} != {"jsonrpc", "id", "method"}:
        return None
    if message["jsonrpc"] != "2.0" or message["method"] != "tools/list" or not _plain_id(message["id"]):
        return None
    params = message.get("params", {})
    if params != {} and not _only_progress_token(params):
        return None
    request_id = message["id"]
    try:
        text = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id, ensure_ascii=False)},"result":{result}}}'
        text.encode("utf-8")
    except ValueError:
        return None
    return EarlyAnswer(request_id, text)


def _only_progress_token(params: object) -> bool:
    if not isinstance(params, dict) or set(params) != {"_meta"}:
        return False
    meta = params["_meta"]
    return isinstance(meta, dict) and set(meta) == {"progressToken"} and _plain_id(meta["progressToken"])


def is_initialized(line: bytes) -> bool:
    """Whether ``line`` is the ``notifications/initialized`` notification (which has no answer)."""
    message = _parsed(line)
    return (
        message is not None
        and set(message) - {"params"} == {"jsonrpc", "method"}
        and message["jsonrpc"] == "2.0"
        and message["method"] == "notifications/initialized"
        and isinstance(message.get("params", {}), dict)
    )


def _parsed(line: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _plain_id(value: object) -> TypeGuard[RequestId]:
    if isinstance(value, bool):
        return False
    return isinstance(value, str) or (isinstance(value, int) and -_MAX_ID <= value < _MAX_ID)


def _accepted_params(params: object) -> bool:
    """Initialize params of the shape the SDK validates them to (conservatively: a shape it might
    refuse is left to it). Unknown members are ignored by the SDK, so they are allowed here."""
    if not isinstance(params, dict) or "_meta" in params:
        return False
    info = params.get("clientInfo")
    if not isinstance(params.get("protocolVersion"), str) or not isinstance(info, dict):
        return False
    if not (isinstance(info.get("name"), str) and isinstance(info.get("version"), str)) or "icons" in info:
        return False
    optional = ("title", "description", "websiteUrl")
    if any(info.get(key) is not None and not isinstance(info[key], str) for key in optional):
        return False
    capabilities = params.get("capabilities")
    return isinstance(capabilities, dict) and all(
        isinstance(value, dict) and _capability_tree(value) for value in capabilities.values()
    )


def _capability_tree(node: dict[str, object]) -> bool:
    """Objects all the way down, with a boolean ``listChanged``: what every capability the SDK
    knows is made of (it validates the known ones, and would refuse another type there)."""
    for key, value in node.items():
        if key == "listChanged":
            if not isinstance(value, bool):
                return False
        elif not isinstance(value, dict) or not _capability_tree(value):
            return False
    return True


class EarlyInput:
    """Reads stdin up to its first message on a thread, answers it if it is ``initialize``, and
    keeps what it read for the transport (:meth:`wait`). Reads a duplicate of fd ``fd_in`` and writes
    to a duplicate of fd ``fd_out``: the transport later points both descriptors elsewhere."""

    def __init__(self, card: ServerCard, fd_in: int = 0, fd_out: int = 1) -> None:
        self._card = card
        self._source = os.dup(fd_in)
        try:
            self._sink = os.dup(fd_out)
        except OSError:
            os.close(self._source)
            raise
        self._read = b""
        self._start = 0  # where the next line starts in what was read
        #: the requests answered, in order (read once :meth:`wait` has returned)
        self.answered: list[EarlyAnswer] = []
        self._thread = threading.Thread(target=self._run, name="construct-early-initialize", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bytes:
        """Everything read from stdin so far (the first message, and whatever came with it), once
        the thread is done; from a thread that may block (the relay's)."""
        self._thread.join(timeout)
        return self._read

    def _run(self) -> None:
        try:
            line = self._next_line()
            answer = initialize_answer(line, self._card) if line is not None else None
            if answer is None:
                return
            self._answer(answer)
            tools = self._card.tools_list
            while tools is not None and (line := self._next_line()) is not None:
                if not is_initialized(line):
                    listed = tools_list_answer(line, tools)
                    if listed is not None:
                        self._answer(listed)
                    return
        except OSError as exc:
            log.warning(
                "cannot answer initialize early: %s", exc, extra={"action": "early_initialize_failed"}
            )
        finally:
            os.close(self._source)
            os.close(self._sink)

    def _next_line(self) -> bytes | None:
        """The next line that is not blank (the transport drops blank ones), or None at the end of
        the input or past :data:`FIRST_LINE_LIMIT` bytes of it."""
        while len(self._read) - self._start <= FIRST_LINE_LIMIT:
            newline = self._read.find(b"\n", self._start)
            if newline == -1:
                chunk = os.read(self._source, _CHUNK)
                if not chunk:
                    return None
                self._read += chunk
                continue
            line, self._start = self._read[self._start : newline], newline + 1
            if line.strip():
                return line
        return None

    def _answer(self, answer: EarlyAnswer) -> None:
        self._write((answer.line + "\n").encode("utf-8"))
        self.answered.append(answer)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._sink, view) :]


#: The early input of this process: stdin is the process's, and so is what was read from it before
#: the transport started.
_started: EarlyInput | None = None


def answer_initialize_early(card: ServerCard) -> EarlyInput:
    """Start reading stdin for an ``initialize`` to answer with ``card`` (see the module docstring);
    the stdio transport takes it over (:func:`take_early_input`)."""
    global _started
    early = EarlyInput(card)
    early.start()
    _started = early
    return early


def take_early_input() -> EarlyInput | None:
    """The early input this process started, once (the transport that takes it reads on from it)."""
    global _started
    early, _started = _started, None
    return early


__all__ = [
    "FIRST_LINE_LIMIT",
    "HANDSHAKE_PROTOCOL_VERSIONS",
    "LATEST_HANDSHAKE_VERSION",
    "EarlyAnswer",
    "EarlyInput",
    "ServerCard",
    "answer_initialize_early",
    "initialize_answer",
    "is_initialized",
    "negotiated_version",
    "take_early_input",
    "tools_list_answer",
]
