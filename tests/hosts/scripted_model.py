"""A scripted model on 127.0.0.1 that a host application talks to as if it were its LLM.

One HTTP server (stdlib ``ThreadingHTTPServer`` in a background thread) speaks the four model APIs
the host CLIs of ``tests/hosts`` use, each streaming server-sent events:

=========================  ==================================================================
``POST /v1/messages``      Anthropic Messages (Claude Code; plus its ``HEAD /`` probe)
``POST /v1/responses``     OpenAI Responses (Codex CLI)
``POST .../models/M:streamGenerateContent?alt=sse`` and ``...:generateContent``
                           Gemini (Gemini CLI; ``generateContent`` is its model router's call,
                           with a response schema and no tools)
``POST /v1/chat/completions``  OpenAI Chat Completions (opencode; plus a title request without tools)
=========================  ==================================================================

**What the model does** (:class:`Follower`) uses only what the host shows it, as a real model
would: the request's tool list and the last message. The user's prompt names a chain and a
request (``... the default chain on 'Build a URL shortener'``, or the chain prompt's
``chain="default"`` ... ``Request:``) and is answered with a call of ``orchestrate_start``. After
a tool result, the model finds the answer's JSON object in the text the host shows (after the
host's wrapping: Codex's ``Wall time: ... Output:``, Gemini's ``{"output": "<untrusted_context>..."}``)
and follows its ``next_action``: ``kind == "none"`` ends the conversation with a text answer;
otherwise it calls ``next_action.tool`` (the host's name for it: the tool of the request's list
whose name ends with it) with ``next_action.arguments``, plus ``output`` when ``next_action.add``
names it. A prompt handed out in parts (``read_prompt`` / ``task_prompt`` answers: ``text`` from
``offset`` to ``end`` of ``chars``, and ``system_prompt`` on the first part) is joined in offset
order; a prompt given whole (``system_prompt`` and ``user_prompt`` in a ``run_host_task``) is taken
as it is. Either way the model records, per task id, the system and user prompt it was given
(:attr:`ScriptedModel.prompts`), so a test can compare them with what the run recorded.

The model's answer to a task is deterministic and ``output_chars`` long; a typed step
(``next_action.output_schema``) gets a JSON object matching the schema, the long text in its first
string field, and an enum holding ``revise`` and ``approve`` is ``revise`` on the first typed task
and ``approve`` after it (so a review loop goes round once). A tool result the model cannot read
(truncated, an error) ends the conversation with a text saying so: a test then fails at once, with
what the model saw (:attr:`ScriptedModel.seen`), instead of waiting for a timeout.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import re
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: Short outputs (case a) and real-sized ones (cases b and c).
SHORT_OUTPUT_CHARS = 200
LONG_OUTPUT_CHARS = 60_000

_PLAIN_PROMPT = re.compile(r"the ([\w-]+) chain on '([^']*)'")
_CHAIN_PROMPT = re.compile(r'chain="([\w-]+)".*?\nRequest:\n(.*)\Z', re.DOTALL)


# ------------------------------------------------------------------------------------------------
# The model's decisions


@dataclass(frozen=True)
class Call:
    """Call a tool of the host (by the host's name for it) with these arguments."""

    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Final:
    """Answer with text and no tool call: the conversation ends."""

    text: str


Move = Call | Final


@dataclass
class Seen:
    """One tool result as the host showed it to the model."""

    tool: str
    #: characters of the text the host sent (its wrapping included)
    shown_chars: int
    #: characters of our answer's JSON found in it, or None when there was none to read
    answer_chars: int | None
    #: the ``next_action.kind`` the answer asked for
    kind: str | None
    #: the first 300 characters of the text, kept when the answer could not be read
    head: str = ""


@dataclass
class Follower:
    """The protocol a host's model follows (see the module docstring); thread-safe."""

    output_chars: int
    #: per task id: the system prompt and the user prompt given to the model
    prompts: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: every tool result the model read, in order
    seen: list[Seen] = field(default_factory=list)
    #: every move made, in order (the tool names as the host named them)
    moves: list[Move] = field(default_factory=list)
    _parts: dict[str, dict[int, str]] = field(default_factory=dict)
    _systems: dict[str, str] = field(default_factory=dict)
    _typed: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, prompt: str, tools: Sequence[str]) -> Move:
        """The answer to the user's prompt: start the chain it names."""
        found = _CHAIN_PROMPT.search(prompt) or _PLAIN_PROMPT.search(prompt)
        if found is None:
            return self._made(Final(f"I do not see which chain to start in: {prompt[:200]!r}"))
        chain, request = found.group(1), found.group(2).strip()
        return self._made(self._call(tools, "orchestrate_start", {"request": request, "chain": chain}))

    def follow(self, tool: str, shown: str, tools: Sequence[str]) -> Move:
        """The answer to a tool result (``shown``: its text as the host sent it)."""
        answer, size = find_answer(shown)
        action = answer.get("next_action") if answer is not None else None
        kind = action.get("kind") if isinstance(action, dict) else None
        with self._lock:
            self.seen.append(
                Seen(tool, len(shown), size, kind if isinstance(kind, str) else None, shown[:300])
            )
        if answer is None or not isinstance(action, dict) or not isinstance(kind, str):
            return self._made(Final(f"I cannot read the answer of {tool}: {shown[:300]!r}"))
        self._record_prompt(answer, action)
        if kind == "none":
            return self._made(Final(f"The run {answer.get('run_id')} has ended: {answer.get('status')}."))
        name, arguments = action.get("tool"), action.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return self._made(Final(f"next_action {kind!r} names no call"))
        arguments = dict(arguments)
        add = action.get("add")
        if isinstance(add, dict) and "output" in add:
            arguments["output"] = self._output(str(action.get("task_id")), action.get("output_schema"))
        if kind == "approve" and "decision" not in arguments:
            arguments["decision"] = "approve"
        return self._made(self._call(tools, name, arguments))

    def _record_prompt(self, answer: Mapping[str, Any], action: Mapping[str, Any]) -> None:
        """Keep the prompt (or the part of it) this answer hands out."""
        with self._lock:
            if "text" in answer and "offset" in answer and "task_id" in answer:  # a task_prompt part
                task = str(answer["task_id"])
                self._parts.setdefault(task, {})[int(answer["offset"])] = str(answer["text"])
                if "system_prompt" in answer:
                    self._systems[task] = str(answer["system_prompt"])
            if action.get("kind") != "run_host_task":
                return
            task = str(action.get("task_id"))
            if "system_prompt" in action and "user_prompt" in action:
                self.prompts[task] = (str(action["system_prompt"]), str(action["user_prompt"]))
            elif task in self._parts:
                parts = self._parts[task]
                self.prompts[task] = (self._systems.get(task, ""), "".join(parts[o] for o in sorted(parts)))

    def _output(self, task_id: str, schema: object) -> str:
        if not isinstance(schema, dict):
            return filler(f"the output of task {task_id}", self.output_chars)
        with self._lock:
            if task_id not in self._typed:
                self._typed.append(task_id)
            visit = self._typed.index(task_id)
        value = typed_value(schema, visit, f"the notes of task {task_id}", self.output_chars)
        return json.dumps(value)

    def _call(self, tools: Sequence[str], name: str, arguments: dict[str, Any]) -> Move:
        host_name = host_tool_name(tools, name)
        if host_name is None:
            return Final(f"The host offers no tool {name!r} (its tools: {sorted(tools)})")
        return Call(host_name, arguments)

    def _made(self, move: Move) -> Move:
        with self._lock:
            self.moves.append(move)
        return move


def host_tool_name(tools: Sequence[str], name: str) -> str | None:
    """The host's name for our tool ``name``: the listed tool named so, or ending with ``_name``
    (``mcp__construct__name``, ``mcp_construct_name``, ``construct_name``) or, in a namespace,
    ``.name`` (``mcp__construct.name``)."""
    if name in tools:
        return name
    matches = [t for t in tools if t.endswith(("_" + name, "." + name))]
    return matches[0] if len(matches) == 1 else None


def find_answer(text: str) -> tuple[dict[str, Any] | None, int | None]:
    """Our answer in a tool result's text as a host shows it: the first JSON object holding
    ``next_action`` (whatever the host put around it), and its length in characters."""
    decoder = json.JSONDecoder()
    for match in itertools.islice(re.finditer(r"\{", text), 200):
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict) and "next_action" in value:
            return value, end - match.start()
    return None, None


def filler(title: str, chars: int) -> str:
    """A deterministic text of exactly ``chars`` characters: numbered lines about ``title``."""
    lines: list[str] = []
    size = 0
    for number in itertools.count(1):
        line = f"{number:05d} {title}: deterministic text from the scripted model.\n"
        lines.append(line)
        size += len(line)
        if size >= chars:
            break
    return "".join(lines)[:chars]


def typed_value(schema: Mapping[str, Any], visit: int, title: str, chars: int) -> dict[str, Any]:
    """An object matching a step's output schema (objects of enums, strings, numbers, booleans):
    the first string field holds the long text; an enum with ``revise`` and ``approve`` is
    ``revise`` on the first visit, ``approve`` after."""
    value: dict[str, Any] = {}
    text_given = False
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name, prop in properties.items():
        enum = prop.get("enum")
        if isinstance(enum, list) and enum:
            if "revise" in enum and "approve" in enum:
                value[name] = "revise" if visit == 0 else "approve"
            else:
                value[name] = enum[0]
        elif prop.get("type") == "string":
            value[name] = "" if text_given else filler(title, max(0, chars - 40))
            text_given = True
        elif prop.get("type") in ("integer", "number"):
            value[name] = 1
        elif prop.get("type") == "boolean":
            value[name] = True
    return value


# ------------------------------------------------------------------------------------------------
# The four APIs: what a request says, and how a move is streamed back


@dataclass(frozen=True)
class Turn:
    """What a model request asks for: the tools offered (host names), and either the user's
    prompt (``prompt``) or the last tool result (``tool`` and ``result``); ``None`` of both for a
    side request (a title, a router's choice)."""

    tools: list[str]
    prompt: str | None = None
    tool: str | None = None
    result: str | None = None


def _texts(content: object) -> str:
    """The text of a message content: a string, or a list of text blocks/parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for block in content:
            if isinstance(block, str):
                out.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                out.append(block["text"])
        return "".join(out)
    return ""


def anthropic_turn(body: Mapping[str, Any]) -> Turn:
    tools = [t["name"] for t in body.get("tools", []) if isinstance(t, dict) and "name" in t]
    # Claude Code also sends a message of role "system" after the conversation
    messages = [m for m in body.get("messages", []) if m.get("role") in ("user", "assistant")]
    names = {}
    for message in messages:
        for block in message.get("content", []) if isinstance(message.get("content"), list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                names[block.get("id")] = block.get("name")
    if not messages or not tools:
        return Turn(tools)
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, list):
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            block = results[-1]
            return Turn(
                tools, tool=str(names.get(block.get("tool_use_id"))), result=_texts(block.get("content"))
            )
    if names:  # a user message after tool calls: not the prompt that starts the run
        return Turn(tools, prompt="")
    return Turn(tools, prompt=_texts(content))


def responses_turn(body: Mapping[str, Any]) -> Turn:
    tools: list[str] = []
    for tool in body.get("tools", []):
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            tools += [f"{tool.get('name')}.{t.get('name')}" for t in tool.get("tools", [])]
        elif "name" in tool:
            tools.append(str(tool["name"]))
    items = [i for i in body.get("input", []) if isinstance(i, dict)]
    if not items or not tools:
        return Turn(tools)
    calls = {i.get("call_id"): i for i in items if i.get("type") == "function_call"}
    last = items[-1]
    if last.get("type") == "function_call_output":
        call = calls.get(last.get("call_id"), {})
        name = f"{call.get('namespace')}.{call.get('name')}" if call.get("namespace") else call.get("name")
        output = last.get("output")
        return Turn(tools, tool=str(name), result=output if isinstance(output, str) else _texts(output))
    if calls:
        return Turn(tools, prompt="")
    prompt = ""
    for item in reversed(items):
        if item.get("type") == "message" and item.get("role") == "user":
            prompt = _texts(item.get("content"))
            break
    return Turn(tools, prompt=prompt)


def gemini_turn(body: Mapping[str, Any]) -> Turn:
    tools = [
        str(d["name"])
        for t in body.get("tools", [])
        for d in t.get("functionDeclarations", [])
        if isinstance(d, dict) and "name" in d
    ]
    contents = body.get("contents", [])
    if not contents or not tools:
        return Turn(tools)
    parts = contents[-1].get("parts", [])
    responses = [p["functionResponse"] for p in parts if isinstance(p, dict) and "functionResponse" in p]
    if responses:
        response = responses[-1]
        shown = response.get("response")
        text = json.dumps(shown) if not isinstance(shown, str) else shown
        if isinstance(shown, dict) and isinstance(shown.get("output"), str):
            text = shown["output"]
        return Turn(tools, tool=str(response.get("name")), result=text)
    called = any("functionCall" in p for c in contents for p in c.get("parts", []) if isinstance(p, dict))
    if called:
        return Turn(tools, prompt="")
    return Turn(tools, prompt="".join(p.get("text", "") for p in parts if isinstance(p, dict)))


def chat_turn(body: Mapping[str, Any]) -> Turn:
    tools = [
        str(t["function"]["name"])
        for t in body.get("tools", [])
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    messages = body.get("messages", [])
    if not messages or not tools:
        return Turn(tools)
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            names[call.get("id")] = call.get("function", {}).get("name")
    last = messages[-1]
    if last.get("role") == "tool":
        return Turn(tools, tool=str(names.get(last.get("tool_call_id"))), result=_texts(last.get("content")))
    if names:
        return Turn(tools, prompt="")
    return Turn(tools, prompt=_texts(last.get("content")))


def _sse(event: str | None, data: Mapping[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _pieces(text: str, size: int = 4_000) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def anthropic_stream(move: Move, model: str, n: int) -> Iterator[bytes]:
    usage = {"input_tokens": 10, "output_tokens": 1}
    message: dict[str, Any] = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    yield _sse("message_start", {"type": "message_start", "message": message})
    if isinstance(move, Call):
        block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{n}", "name": move.tool, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": p} for p in _pieces(json.dumps(move.arguments))
        ]
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(move.text)]
        stop = "end_turn"
    yield _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})
    for delta in deltas:
        yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


def responses_stream(move: Move, model: str, n: int) -> Iterator[bytes]:
    response: dict[str, Any] = {
        "id": f"resp_{n}",
        "object": "response",
        "model": model,
        "status": "in_progress",
    }
    yield _sse("response.created", {"type": "response.created", "response": response})
    if isinstance(move, Call):
        namespace, _, name = move.tool.rpartition(".")
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": name,
            "arguments": json.dumps(move.arguments),
            "status": "completed",
        }
        if namespace:
            item["namespace"] = namespace
    else:
        item = {
            "type": "message",
            "id": f"msg_{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": move.text, "annotations": []}],
        }
        added = {**item, "status": "in_progress", "content": []}
        yield _sse(
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": added},
        )
        yield _sse(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": 0,
                "delta": move.text,
            },
        )
    yield _sse(
        "response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}
    )
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    done = {**response, "status": "completed", "output": [item], "usage": usage}
    yield _sse("response.completed", {"type": "response.completed", "response": done})


def gemini_chunk(move: Move, model: str) -> dict[str, Any]:
    part: dict[str, Any]
    if isinstance(move, Call):
        part = {"functionCall": {"name": move.tool, "args": move.arguments}}
    else:
        part = {"text": move.text}
    return {
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": model,
    }


def chat_stream(move: Move, model: str, n: int) -> Iterator[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0, "model": model}
        return _sse(None, {**body, "choices": [choice], **extra})

    if isinstance(move, Call):
        first = {
            "index": 0,
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": move.tool, "arguments": ""},
        }
        yield chunk({"role": "assistant", "content": None, "tool_calls": [first]})
        for piece in _pieces(json.dumps(move.arguments)):
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        finish = "tool_calls"
    else:
        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(move.text):
            yield chunk({"content": piece})
        finish = "stop"
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    yield chunk({}, finish, usage=usage)
    yield b"data: [DONE]\n\n"


def schema_example(schema: object, name: str = "") -> object:
    """A value matching a (router's) response schema: its enums' first values, short strings. A
    number named a confidence is 0: Gemini CLI asks, after many turns, how confident the model is
    that the conversation is stuck in a loop (``unproductive_state_confidence``), and ends it when
    the answer is high; a model reading a prompt in parts is making progress."""
    if not isinstance(schema, dict):
        return "x"
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "")).lower()
    if kind == "object" or "properties" in schema:
        return {k: schema_example(v, k) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [schema_example(schema.get("items"))]
    if kind in ("integer", "number"):
        return 0 if "confidence" in name else 1
    if kind == "boolean":
        return True
    return "scripted"


# ------------------------------------------------------------------------------------------------
# The server


@dataclass
class Request:
    """One request the model server answered (for a failing test's report)."""

    method: str
    path: str
    chars: int
    turn: str


class ScriptedModel:
    """The model server: ``with ScriptedModel(output_chars) as model: ... model.base_url``."""

    def __init__(self, output_chars: int = SHORT_OUTPUT_CHARS, dump_dir: Path | None = None) -> None:
        self.dump_dir = dump_dir
        self.follower = Follower(output_chars)
        self.requests: list[Request] = []
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                model._record(self.command, self.path, 0, "probe")
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                model._record(self.command, self.path, 0, "unknown")
                self._json(404, {"error": {"message": f"no {self.path} here", "type": "not_found"}})

            def do_POST(self) -> None:
                raw = self._body()
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                model._answer(self, body, len(raw))

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    raw = bytes(data)
                else:
                    raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = self.headers.get("Content-Encoding", "").lower()
                if encoding == "gzip":
                    raw = gzip.decompress(raw)
                elif encoding == "deflate":
                    raw = zlib.decompress(raw)
                return raw

            def _json(self, status: int, value: object) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def stream(self, events: Iterator[bytes]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in events:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def prompts(self) -> dict[str, tuple[str, str]]:
        return dict(self.follower.prompts)

    @property
    def seen(self) -> list[Seen]:
        return list(self.follower.seen)

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _record(self, method: str, path: str, chars: int, turn: str) -> None:
        with self._lock:
            self.requests.append(Request(method, path, chars, turn))

    def _move(self, turn: Turn) -> Move | None:
        """The model's move for a request, or None for a side request (no tools)."""
        if turn.result is not None:
            return self.follower.follow(str(turn.tool), turn.result, turn.tools)
        if turn.prompt:
            return self.follower.start(turn.prompt, turn.tools)
        if turn.prompt == "":
            return Final("Nothing more to do.")
        return None

    def _answer(self, handler: Any, body: dict[str, Any], chars: int) -> None:
        path = handler.path.split("?")[0]
        n = next(self._count)
        model = str(body.get("model", "scripted"))
        if self.dump_dir is not None:
            (self.dump_dir / f"{n:03d}.json").write_text(
                json.dumps({"path": handler.path, "body": body}, indent=1)
            )
        if path.endswith("/messages/count_tokens"):  # Claude Code sizing a long tool result
            self._record("POST", path, chars, "count_tokens")
            handler._json(200, {"input_tokens": chars // 4})
        elif path.endswith("/messages"):
            turn = anthropic_turn(body)
            move = self._move(turn) or Final("OK")
            self._record("POST", path, chars, _describe(turn, move))
            if not body.get("stream"):
                handler._json(200, _anthropic_message(move, model, n))
                return
            handler.stream(anthropic_stream(move, model, n))
        elif path.endswith("/responses"):
            turn = responses_turn(body)
            move = self._move(turn) or Final("OK")
            self._record("POST", path, chars, _describe(turn, move))
            handler.stream(responses_stream(move, model, n))
        elif path.endswith(":streamGenerateContent") or path.endswith(":generateContent"):
            model = path.rsplit("/", 1)[-1].split(":")[0]
            turn = gemini_turn(body)
            config = body.get("generationConfig", {})
            schema = config.get("responseJsonSchema") or config.get("responseSchema")
            # no tools: the router's call, a JSON answer to its response schema
            move = self._move(turn) or Final(json.dumps(schema_example(schema)) if schema else "OK")
            self._record("POST", path, chars, _describe(turn, move))
            if path.endswith(":generateContent"):
                handler._json(200, gemini_chunk(move, model))
                return
            handler.stream(iter([_sse(None, gemini_chunk(move, model))]))
        elif path.endswith("/chat/completions"):
            turn = chat_turn(body)
            move = self._move(turn) or Final("Scripted run")
            self._record("POST", path, chars, _describe(turn, move))
            if not body.get("stream"):
                handler._json(200, _chat_completion(move, model, n))
                return
            handler.stream(chat_stream(move, model, n))
        else:
            self._record("POST", path, chars, "unknown")
            handler._json(404, {"error": {"message": f"no {path} here", "type": "not_found"}})


def _describe(turn: Turn, move: Move) -> str:
    asked = "prompt" if turn.prompt else f"result of {turn.tool}" if turn.result is not None else "side"
    did = f"call {move.tool}" if isinstance(move, Call) else f"text {move.text[:80]!r}"
    return f"{asked} -> {did}"


def _anthropic_message(move: Move, model: str, n: int) -> dict[str, Any]:
    if isinstance(move, Call):
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{n}", "name": move.tool, "input": move.arguments}
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": move.text}]
        stop = "end_turn"
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def _chat_completion(move: Move, model: str, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if isinstance(move, Call):
        message["tool_calls"] = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": move.tool, "arguments": json.dumps(move.arguments)},
            }
        ]
        finish = "tool_calls"
    else:
        message["content"] = move.text
        finish = "stop"
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def prompt_sha256(system: str, user: str) -> str:
    """What the run records of a host task's prompts (``host_task_prepared.prompt_sha256``): the
    SHA-256 of the system prompt, a NUL and the user prompt, UTF-8."""
    return hashlib.sha256(system.encode() + b"\x00" + user.encode()).hexdigest()
