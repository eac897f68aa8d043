"""The ``initialize`` and ``tools/list`` answered on stdio before the SDK is imported
(``server/transports/handshake.py``) are the SDK's own answers, byte for byte: for every protocol
version the SDK knows and one it does not, for settings that change what the server is built with,
and for the request shapes hosts send. What the early path cannot be sure of (a provider backend,
whose instructions may carry a warning; size limits other than the defaults, which change the
tools; a request the SDK might refuse) it leaves to the server."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types.version
import pytest
from mcp.server.stdio import stdio_server

from orchestration.errors import ConfigError
from server.__main__ import inline_card, stdio_serve_options
from server.app import ConstructApp, instructions_for
from server.mcp.server_card import TOOLS_LIST_FILE, default_tools_list
from server.settings import config, early
from server.settings.config import ENV_VARS, Settings, load_settings
from server.settings.providers import missing_key_warning
from server.transports.handshake import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    EarlyInput,
    initialize_answer,
    is_initialized,
    negotiated_version,
    tools_list_answer,
)

#: every version the SDK knows (the 2026-07-28 one has no handshake), one it does not, and none
VERSIONS = [*mcp_types.version.KNOWN_PROTOCOL_VERSIONS, "1999-01-01", ""]


def initialize(version: str = "2025-06-18", request_id: object = 1, **params: Any) -> str:
    body = {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "host", "version": "1.0"},
        **params,
    }
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": body})


class _Written:
    """Stands in for stdout in the SDK's stdio transport: keeps what it writes, and says when it has
    written ``wanted`` lines."""

    def __init__(self, wanted: int = 0) -> None:
        self.text = ""
        self._wanted = wanted
        self.enough = anyio.Event()
        if wanted == 0:
            self.enough.set()

    async def write(self, text: str) -> None:
        self.text += text
        if self.text.count("\n") >= self._wanted:
            self.enough.set()

    async def flush(self) -> None:
        pass


INITIALIZED = '{"jsonrpc": "2.0", "method": "notifications/initialized"}'
TOOLS_LIST = '{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}'
# as Codex CLI 0.171.0 writes them (its initialize and its tools/list, with a progress token)
CODEX_INITIALIZE = (
    '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    '"capabilities":{"experimental":{"codex/auth-change":{}},"elicitation":{"form":{},"url":{}}},'
    '"clientInfo":{"name":"codex-mcp-client","title":"Codex","version":"0.171.0"}}}'
)
CODEX_LIST = '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"progressToken":0}}}'


async def sdk_answer(settings: Settings, *lines_in: str, answers: int = 0) -> str:
    """What the SDK's stdio transport writes for ``lines_in`` (the input kept open until it has
    written ``answers`` lines, then ended), serving the server :class:`ConstructApp` builds from
    ``settings``."""
    server = ConstructApp(settings).build_server()
    out = _Written(answers)

    async def lines() -> AsyncIterator[str]:
        for line in lines_in:
            yield line + "\n"
        with anyio.fail_after(30):
            await out.enough.wait()

    stdin: Any = lines()
    stdout: Any = out
    async with stdio_server(stdin=stdin, stdout=stdout) as (read, write):
        lowlevel = server._lowlevel_server
        await lowlevel.run(read, write, lowlevel.create_initialization_options())
    return out.text


def settings_in(home: Path, config_text: str | None = None, **env: str) -> Settings:
    if config_text is not None:
        (home / "construct.toml").write_text(config_text)
    return load_settings(env={"CONSTRUCT_HOME": str(home), "CONSTRUCT_ORCHESTRATION_STORE": "memory", **env})


def test_the_copied_sdk_facts_are_the_sdks() -> None:
    assert HANDSHAKE_PROTOCOL_VERSIONS == mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS
    assert LATEST_HANDSHAKE_VERSION == mcp_types.version.LATEST_HANDSHAKE_VERSION
    assert negotiated_version("2024-11-05") == "2024-11-05"
    assert negotiated_version("2026-07-28") == mcp_types.version.LATEST_HANDSHAKE_VERSION
    assert (early.DEFAULT_HOME, early.CONFIG_FILE_NAME) == (
        config.DEFAULT_HOME,
        config.CONFIG_FILE_NAME,
    )
    assert ENV_VARS[early.HOME_VARIABLE] == "home"
    assert ENV_VARS[early.BACKEND_VARIABLE] == early.BACKEND_KEY == "worker_backend"
    assert {ENV_VARS[variable]: key for key, variable in early.LIMITS.items()} == {
        key: key for key in early.LIMITS
    }


def test_the_tools_list_file_is_the_sdks_answer() -> None:
    # Regenerate with `.venv/bin/python scripts/tools_list.py` after changing a tool.
    from scripts.tools_list import default_tools_list as sdk_default_tools_list

    assert default_tools_list() == anyio.run(sdk_default_tools_list), f"{TOOLS_LIST_FILE} is stale"


@pytest.mark.parametrize("version", VERSIONS)
async def test_the_early_answers_are_the_sdks_for_every_protocol_version(
    tmp_path: Path, version: str
) -> None:
    line = initialize(version)
    card = inline_card()
    early = initialize_answer(line.encode(), card)
    assert early is not None and early.request_id == 1 and card.tools_list is not None
    listed = tools_list_answer(TOOLS_LIST.encode(), card.tools_list)
    assert listed is not None and listed.request_id == 2
    sdk = await sdk_answer(settings_in(tmp_path), line, INITIALIZED, TOOLS_LIST, answers=2)
    assert early.line + "\n" + listed.line + "\n" == sdk
    expected = version if version in mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS else "2025-11-25"
    assert json.loads(early.line)["result"]["protocolVersion"] == expected


SETTINGS = {
    "defaults": (None, {}),
    "inline in the environment": (None, {"CONSTRUCT_WORKER_BACKEND": "inline"}),
    # the file beats the environment; extra chains and specialists add prompts, not capabilities
    "inline in the file over provider in the environment, with chains": (
        'worker_backend = "inline"\nmax_answer_chars = 5000\n\n'
        '[specialists.critic]\ndescription = "critic"\npersona = "Criticise."\n\n'
        '[chains.critique]\nsteps = ["critic"]\n',
        {"CONSTRUCT_WORKER_BACKEND": "provider"},
    ),
    # the tools change with the limits: initialize early, tools/list by the server
    "small limits": (None, {"CONSTRUCT_MAX_OUTPUT_CHARS": "1000", "CONSTRUCT_MAX_REQUEST_CHARS": "1000"}),
}


async def test_the_early_answers_are_the_sdks_for_codex(tmp_path: Path) -> None:
    card = inline_card()
    assert card.tools_list is not None
    answered = initialize_answer(CODEX_INITIALIZE.encode(), card)
    listed = tools_list_answer(CODEX_LIST.encode(), card.tools_list)
    assert answered is not None and listed is not None
    sdk = await sdk_answer(settings_in(tmp_path), CODEX_INITIALIZE, INITIALIZED, CODEX_LIST, answers=2)
    assert answered.line + "\n" + listed.line + "\n" == sdk


@pytest.mark.parametrize("case", sorted(SETTINGS))
async def test_the_early_answers_are_the_sdks_for_settings_it_answers_for(tmp_path: Path, case: str) -> None:
    config_text, env = SETTINGS[case]
    settings = settings_in(tmp_path, config_text, **env)
    sure = early.early_settings(env={"CONSTRUCT_HOME": str(tmp_path), **env})
    assert sure.inline
    card = inline_card(sure.default_limits)
    line = initialize("2025-03-26")
    answered = initialize_answer(line.encode(), card)
    assert answered is not None
    sdk = await sdk_answer(settings, line, INITIALIZED, TOOLS_LIST, answers=2)
    initialize_line, tools_line = sdk.splitlines()
    assert answered.line == initialize_line
    if card.tools_list is None:
        assert settings.limits() != load_settings(env={}).limits()
        # and the tools differ indeed: the early list would have been wrong
        assert tools_line != f'{{"jsonrpc":"2.0","id":2,"result":{default_tools_list()}}}'
    else:
        listed = tools_list_answer(TOOLS_LIST.encode(), card.tools_list)
        assert listed is not None and listed.line == tools_line


#: initialize requests as hosts send them: the early answer must be the SDK's for each
ACCEPTED = {
    "string id": initialize(request_id="init-1"),
    "unicode id": initialize(request_id='é✓ "quoted" \\ \u2028'),
    "negative id": initialize(request_id=-7),
    "id 0": initialize(request_id=0),
    "host capabilities": initialize(
        capabilities={
            "roots": {"listChanged": True},
            "sampling": {"context": {}, "tools": {}},
            "elicitation": {"form": {}, "url": {}},
            "tasks": {"list": {}, "cancel": {}, "requests": {"elicitation": {"create": {}}}},
            "experimental": {"x": {}},
            "io.example/own": {},
        }
    ),
    "client info in full": initialize(
        clientInfo={
            "name": "codex",
            "title": "Codex",
            "version": "0.9",
            "description": "d",
            "websiteUrl": "u",
        }
    ),
    "unknown members": initialize(trace={"on": True}),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
async def test_the_early_answer_is_the_sdks_for_what_hosts_send(tmp_path: Path, case: str) -> None:
    line = ACCEPTED[case]
    early = initialize_answer(line.encode(), inline_card())
    assert early is not None
    assert early.request_id == json.loads(line)["id"]
    assert early.line + "\n" == await sdk_answer(settings_in(tmp_path), line)


#: what the early path leaves to the SDK: not initialize, or a shape the SDK might refuse or write
#: back otherwise (a fractional id, a boolean one, NaN, ...)
REFUSED = {
    "not JSON": "initialize",
    "a batch": f"[{initialize()}]",
    "another method": '{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
    "a notification": '{"jsonrpc": "2.0", "method": "initialize", "params": {}}',
    "JSON-RPC 1.0": initialize().replace('"2.0"', '"1.0"'),
    "a fractional id": initialize(request_id=1.5),
    "an integral float id": initialize(request_id=1.0),
    "a boolean id": initialize(request_id=True),
    "a null id": initialize(request_id=None),
    "an id over 64 bits": initialize(request_id=2**63),
    "no params": '{"jsonrpc": "2.0", "id": 1, "method": "initialize"}',
    "no client version": initialize(clientInfo={"name": "host"}),
    "a numeric protocol version": initialize(version=5),  # type: ignore[arg-type]
    "a string listChanged": initialize(capabilities={"roots": {"listChanged": "yes"}}),
    "a capability that is no object": initialize(capabilities={"sampling": True}),
    "a capability member that is no object": initialize(capabilities={"elicitation": {"form": 1}}),
    "icons": initialize(clientInfo={"name": "h", "version": "1", "icons": [{"src": "x"}]}),
    "_meta": initialize(_meta={"progressToken": 1}),
    "an extra member": initialize()[:-1] + ', "extra": 1}',
    "NaN": initialize(capabilities={"roots": {"listChanged": float("nan")}}),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_sdk_might_refuse_is_left_to_it(case: str) -> None:
    assert initialize_answer(REFUSED[case].encode(), inline_card()) is None


def test_only_a_plain_tools_list_request_is_answered_early() -> None:
    result = '{"tools":[]}'
    for listed in (
        TOOLS_LIST,
        '{"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {}}',
        CODEX_LIST,
    ):
        assert tools_list_answer(listed.encode(), result) is not None
    for other in (
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "x"}}',
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {"progressToken": 1.5}}}',
        '{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"progressToken":1,"a":2}}}',
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "extra": 1}',
        '{"jsonrpc": "2.0", "id": 2.5, "method": "tools/list"}',
        '{"jsonrpc": "2.0", "id": 2, "method": "prompts/list"}',
        '{"jsonrpc": "2.0", "method": "tools/list"}',
    ):
        assert tools_list_answer(other.encode(), result) is None, other
    assert is_initialized(INITIALIZED.encode())
    assert is_initialized(b'{"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}}')
    assert not is_initialized(b'{"jsonrpc": "2.0", "id": 3, "method": "notifications/initialized"}')
    assert not is_initialized(b'{"jsonrpc": "2.0", "method": "notifications/cancelled"}')


@pytest.mark.parametrize(
    "case", ["no client version", "a numeric protocol version", "a capability that is no object", "a null id"]
)
async def test_the_sdk_does_refuse_some_of_them(tmp_path: Path, case: str) -> None:
    answer = await sdk_answer(settings_in(tmp_path), REFUSED[case])
    assert '"result"' not in answer  # an error, or no answer at all (a null id is a notification)


PROBED = {
    # (the config file, the environment) -> whether the probe may answer early
    "defaults": (None, {}),
    "inline env": (None, {"CONSTRUCT_WORKER_BACKEND": "inline"}),
    "provider env": (None, {"CONSTRUCT_WORKER_BACKEND": "provider"}),
    "provider env with a key": (None, {"CONSTRUCT_WORKER_BACKEND": "provider", "ANTHROPIC_API_KEY": "k"}),
    "bad env value": (None, {"CONSTRUCT_WORKER_BACKEND": "Inline"}),
    "inline file": ('worker_backend = "inline"\n', {"CONSTRUCT_WORKER_BACKEND": "provider"}),
    "provider file": ('worker_backend = "provider"\n', {"CONSTRUCT_WORKER_BACKEND": "inline"}),
    "file without the key": ("lease_ttl_seconds = 12\n", {"CONSTRUCT_WORKER_BACKEND": "provider"}),
    "file without the key, inline env": ("lease_ttl_seconds = 12\n", {}),
    "invalid file": ("worker_backend = \n", {}),
    "a limit in the file": ("max_request_chars = 1000\n", {}),
    "a limit in the environment": (None, {"CONSTRUCT_MAX_OUTPUT_CHARS": "1000"}),
    "the default limit, named": (None, {"CONSTRUCT_MAX_OUTPUT_CHARS": "1000000"}),
    "another size, named": ('max_answer_chars = 5000\nworker_backend = "inline"\n', {}),
}


@pytest.mark.parametrize("case", sorted(PROBED))
def test_the_probe_says_inline_exactly_when_the_settings_have_no_warning(tmp_path: Path, case: str) -> None:
    config_text, env = PROBED[case]
    env = {"CONSTRUCT_HOME": str(tmp_path), **env}
    if config_text is not None:
        (tmp_path / "construct.toml").write_text(config_text)
    sure = early.early_settings(env=env)
    probed = sure.inline
    try:
        settings = load_settings(env=env)
    except Exception:
        assert not sure.inline  # the settings report the error; nothing was answered before
        return
    inline = settings.worker_backend == "inline"
    assert probed == inline
    assert sure.default_limits == (settings.sources.keys().isdisjoint(early.LIMITS))
    assert sure.default_limits <= (settings.limits() == load_settings(env={}).limits())
    if probed:
        assert (
            missing_key_warning(settings) is None and instructions_for(settings) == inline_card().instructions
        )


def test_a_provider_backend_changes_the_instructions_so_the_server_answers(tmp_path: Path) -> None:
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_WORKER_BACKEND": "provider"}
    assert not early.early_settings(env=env).inline
    assert "Warning: the worker backend is provider" in instructions_for(load_settings(env=env))


def test_the_probe_reads_the_config_file_named_and_the_home_given(tmp_path: Path) -> None:
    named = tmp_path / "named.toml"
    named.write_text('worker_backend = "provider"\n')
    assert not early.early_settings(config_file=str(named), env={}).inline
    assert early.early_settings(config_file=str(tmp_path / "missing.toml"), env={}) == early.UNSURE
    (tmp_path / "construct.toml").write_text('worker_backend = "provider"\n')
    assert not early.early_settings(home=str(tmp_path), env={}).inline
    assert early.early_settings(home=str(tmp_path / "elsewhere"), env={}) == early.EarlySettings(True, True)
    assert early.early_settings(home=" ", env={}) == early.UNSURE


def test_a_home_the_settings_refuse_gets_no_early_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server exits at once with a configuration error: an answered initialize would make a
    # host take it for a server that started.
    file = tmp_path / "file"
    file.write_text("")
    for env in (
        {"CONSTRUCT_HOME": "relative"},
        {"CONSTRUCT_HOME": str(file)},
        {"CONSTRUCT_HOME": f"{file}/h"},
    ):
        with pytest.raises(ConfigError):
            load_settings(env=env)
        assert early.early_settings(env=env) == early.UNSURE, env
    assert early.early_settings(home=str(file), env={}) == early.UNSURE
    monkeypatch.chdir(tmp_path)
    assert early.early_settings(home="relative", env={}) == early.EarlySettings(True, True)  # --home may be
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    with pytest.raises(ConfigError):
        load_settings(env={"CONSTRUCT_HOME": str(locked)})
    assert early.early_settings(env={"CONSTRUCT_HOME": str(locked)}) == early.UNSURE


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["serve"], {}),
        (["serve", "--transport", "stdio", "--home", "/h"], {"--transport": "stdio", "--home": "/h"}),
        (
            ["serve", "--config=/c.toml", "--log-level", "DEBUG"],
            {"--config": "/c.toml", "--log-level": "DEBUG"},
        ),
        (["serve", "--store", "memory", "--port", "9000"], {"--store": "memory", "--port": "9000"}),
        (["serve", "--transport", "sse"], None),
        (["serve", "--transport=streamable-http"], None),
        (["serve", "--help"], None),
        (["serve", "--home"], None),
        (["serve", "--home", "--store", "memory"], None),
        (["serve", "--log-level", "LOUD"], None),
        (["serve", "--port", "eighty"], None),
        (["serve", "--home", "/a", "--home", "/b"], None),
        (["serve", "--tr", "stdio"], None),
        (["runs", "list"], None),
        ([], None),
    ],
)
def test_only_serve_on_stdio_with_arguments_it_understands_is_answered_early(
    argv: list[str], options: dict[str, str] | None
) -> None:
    assert stdio_serve_options(argv) == options


def early_input(card_tools: bool, *lines_in: str) -> tuple[EarlyInput, bytes]:
    """An :class:`EarlyInput` on pipes fed ``lines_in`` (the input left open): it and what it wrote."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        os.write(in_write, "".join(line + "\n" for line in lines_in).encode())
        reader = EarlyInput(inline_card(default_limits=card_tools), in_read, out_write)
        reader.start()
        reader.wait(timeout=30)
        assert not reader._thread.is_alive(), "the early reader did not stop"
        os.close(out_write)
        out_write = -1
        written = b""
        while chunk := os.read(out_read, 65536):
            written += chunk
        return reader, written
    finally:
        for fd in (in_read, in_write, out_read, out_write):
            if fd != -1:
                os.close(fd)


def test_the_early_reader_answers_initialize_and_tools_list_then_stops() -> None:
    reader, written = early_input(True, initialize(), "", INITIALIZED, TOOLS_LIST)
    assert [a.request_id for a in reader.answered] == [1, 2]
    assert written == "".join(a.line + "\n" for a in reader.answered).encode()
    # everything it read is handed on, the answered requests included
    assert reader.wait() == (initialize() + "\n\n" + INITIALIZED + "\n" + TOOLS_LIST + "\n").encode()


def test_the_early_reader_stops_at_a_message_it_does_not_answer() -> None:
    ping = '{"jsonrpc": "2.0", "id": 2, "method": "ping"}'
    reader, _ = early_input(True, initialize(), INITIALIZED, ping, TOOLS_LIST)
    assert [a.request_id for a in reader.answered] == [1]
    assert reader.wait().endswith((ping + "\n" + TOOLS_LIST + "\n").encode())


def test_without_the_tools_list_the_early_reader_stops_after_initialize() -> None:
    # With the input left open: it must not wait for a next message it would not answer.
    reader, _ = early_input(False, initialize())
    assert [a.request_id for a in reader.answered] == [1]


def test_a_first_message_other_than_initialize_is_not_answered() -> None:
    reader, written = early_input(True, TOOLS_LIST, initialize())
    assert reader.answered == [] and written == b""
