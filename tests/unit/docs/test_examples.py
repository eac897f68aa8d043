"""Every example of README.md and docs/**/*.md is what it claims (issue 26: three of the README's TOML
blocks were not TOML at all, inline tables split across lines, and a copied example failed with
"Invalid initial character for a key part"). The blocks are found by :mod:`docs.fenced_blocks`; one
test per block, named ``file:line``:

- ``toml``: a whole ``construct.toml`` that the server's settings and the catalog load; with
  ``<!-- fragment -->`` above it, a piece of one that parses as TOML;
- ``json``: parses; a host config (``mcpServers`` or ``servers``) runs ``construct-mcp serve`` with
  arguments the real CLI parser takes and variables the settings know;
- ``python`` with ``<!-- fragment -->``: compiles (whole scripts run in
  tests/acceptance/test_docs_python_examples.py);
- ``sh``, ``bash``, ``console``: every ``construct-mcp`` command parses with the real CLI parser.

Other languages are not checked (see :mod:`docs.fenced_blocks`).
"""

from __future__ import annotations

import io
import json
import re
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from docs.fenced_blocks import SHELL, Block, all_blocks, construct_argv, construct_commands, quickstart_blocks
from docs.run_quickstart import quickstart_script
from orchestration.chains import Catalog
from orchestration.errors import ConfigError
from server.cli.grammar import build_parser
from server.settings.config import ENV_VARS, load_settings

ROOT = Path(__file__).resolve().parents[3]
BLOCKS = all_blocks(ROOT)
#: Issue 26: the README is a quick start; the manual is the site in docs/.
README_MAX_LINES = 250


def _blocks(*langs: str, markers: tuple[str | None, ...] = (None,)) -> pytest.MarkDecorator:
    """The documentation's blocks of these languages with one of these markers, as parameters."""
    chosen = [b for b in BLOCKS if b.lang in langs and b.marker in markers]
    return pytest.mark.parametrize("block", chosen, ids=[b.where for b in chosen])


def _parse_cli(argv: list[str], where: str) -> Any:
    """``argv`` parsed by the real CLI parser; a parse error fails the test with argparse's message."""
    stderr = io.StringIO()
    try:
        with redirect_stderr(stderr), redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help exits 0: a command a reader may type
            pytest.fail(f"{where}: `construct-mcp {' '.join(argv)}` does not parse:\n{stderr.getvalue()}")
    return None


# ------------------------------------------------------------------------------------------- toml


@_blocks("toml", markers=(None, "session"))
def test_every_toml_example_loads_as_a_config_file(tmp_path: Path, block: Block) -> None:
    tomllib.loads(block.text)  # valid TOML first: the error then names the line a reader copied
    config = tmp_path / "construct.toml"
    config.write_text(block.text, "utf-8")
    for persona in re.findall(r'persona_file\s*=\s*"([^"]+)"', block.text):
        (tmp_path / persona).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / persona).write_text("You are a specialist of the example.\n", "utf-8")
    load_settings(env={}, home=tmp_path, config_file=config)
    Catalog.load(config)


@_blocks("toml", markers=("fragment",))
def test_every_toml_fragment_parses(block: Block) -> None:
    tomllib.loads(block.text)


def _shown_builtin_chains() -> list[Block]:
    """Whole config files that define one chain only, named as a built-in one: shown as it (unless
    shortened: a block with ``...`` in it, as the README's ``research`` chain, is not compared)."""
    builtin = Catalog.builtin().chains
    shown = []
    for block in BLOCKS:
        if block.lang != "toml" or block.marker is not None:
            continue
        try:
            chains = tomllib.loads(block.text).get("chains", {})
        except tomllib.TOMLDecodeError:
            continue  # its own test reports it, with the block's line
        shortened = "..." in block.text
        if len(chains) == 1 and next(iter(chains)) in builtin and not shortened:
            shown.append(block)
    return shown


@pytest.mark.parametrize("block", _shown_builtin_chains(), ids=lambda b: b.where)
def test_a_built_in_chain_the_docs_show_is_the_built_in_one(tmp_path: Path, block: Block) -> None:
    (name,) = tomllib.loads(block.text)["chains"]
    config = tmp_path / "construct.toml"
    config.write_text(block.text, "utf-8")
    assert Catalog.load(config).resolve(name) == Catalog.builtin().resolve(name)


# ------------------------------------------------------------------------------------------- json


@_blocks("json")
def test_every_json_example_parses(tmp_path: Path, block: Block) -> None:
    parsed = json.loads(block.text)
    if isinstance(parsed, dict) and ("mcpServers" in parsed or "servers" in parsed):
        _check_host_config(parsed, block.where, tmp_path)


def _check_host_config(config: dict[str, Any], where: str, home: Path) -> None:
    """Every stdio entry of a host's config runs ``construct-mcp serve`` with arguments the CLI
    parser takes and an environment the settings accept; an entry without a command is an HTTP
    one (``url``)."""
    entries = config.get("mcpServers", config.get("servers"))
    assert isinstance(entries, dict) and entries, f"{where}: no server entries"
    for name, entry in entries.items():
        if "command" not in entry:
            assert "url" in entry, f"{where}: the entry {name!r} has neither a command nor a url"
            continue
        argv = construct_argv([entry["command"], *entry.get("args", [])])
        assert argv is not None, f"{where}: the entry {name!r} does not run construct-mcp"
        args = _parse_cli(argv, f"{where} ({name})")
        assert args is not None and args.command == "serve", f"{where}: the entry {name!r} is not `serve`"
        _check_environment(entry.get("env", {}), f"{where} ({name})", home)


def _check_environment(env: dict[str, str], where: str, home: Path) -> None:
    prefixes = [variable for variable in ENV_VARS if variable.endswith("_")]
    for variable in env:
        known = variable in ENV_VARS or any(variable.startswith(p) for p in prefixes)
        assert known, f"{where}: {variable} is no setting of construct-mcp"
    load_settings(env={**env, "CONSTRUCT_HOME": str(home)})


def test_the_host_entries_of_mcp_json_example_start_a_server_the_cli_accepts(tmp_path: Path) -> None:
    """Every entry of ``mcp.json.example`` runs the checkout's ``construct-mcp serve`` on the store
    the CLI reads too (issue 26: an entry named ``--store sqlite`` while the CLI, on the same home,
    read the filesystem store), with variables the settings know."""
    example = json.loads((ROOT / "mcp.json.example").read_text("utf-8"))
    _check_host_config(example, "mcp.json.example", tmp_path)
    for name, entry in example["mcpServers"].items():
        assert entry["command"].endswith("/.venv/bin/construct-mcp"), name
        args = build_parser().parse_args(entry["args"])
        assert (args.command, args.store) == ("serve", None), name  # the store the CLI reads too


# ------------------------------------------------------------------------------------------ python


@_blocks("python", markers=("fragment",))
def test_every_python_fragment_compiles(block: Block) -> None:
    compile(block.text, block.where, "exec")


# ------------------------------------------------------------------------------------------- shell


@_blocks(*SHELL, markers=(None, "quickstart", "session"))
def test_every_construct_mcp_command_of_a_shell_example_parses(block: Block) -> None:
    for line, argv in construct_commands(block):
        _parse_cli(argv, f"{block.path}:{line}")


def test_the_readme_is_a_quick_start_with_exactly_one_quickstart_block() -> None:
    readme_lines = (ROOT / "README.md").read_text("utf-8").count("\n")
    assert readme_lines <= README_MAX_LINES, f"README.md has {readme_lines} lines; the manual goes in docs/"
    found = quickstart_blocks(ROOT)
    assert len(found) == 1, f"README.md needs exactly one <!-- quickstart --> block, found {len(found)}"
    assert found[0].lang in SHELL, f"{found[0].where}: the quickstart block is {found[0].lang!r}, not shell"
    assert "git clone " in quickstart_script(ROOT, ROOT)  # what CI runs (docs/run_quickstart.py)


def test_a_marker_sits_only_on_a_block_it_applies_to() -> None:
    """``fragment`` applies to toml and python blocks; ``quickstart`` only to the README's."""
    for block in BLOCKS:
        if block.marker == "fragment":
            assert block.lang in ("toml", "python"), f"{block.where}: a {block.lang!r} block marked fragment"
        if block.marker == "quickstart":
            assert block.path == "README.md", f"{block.where}: a quickstart block outside README.md"


# ------------------------------------------------------------------- the checks catch what is wrong


def test_the_checks_refuse_what_the_issue_found(tmp_path: Path) -> None:
    split_inline_table = '[chains.release]\nsteps = [\n  { name = "a",\n    specialist = "architect" },\n]\n'
    with pytest.raises(tomllib.TOMLDecodeError):
        test_every_toml_example_loads_as_a_config_file(tmp_path, Block("p.md", 1, "toml", split_inline_table))
    with pytest.raises(Exception, match="aprove_before"):  # a whole file the catalog refuses
        test_every_toml_example_loads_as_a_config_file(
            tmp_path,
            Block("p.md", 1, "toml", '[chains.x]\nsteps = ["architect"]\naprove_before = ["architect"]\n'),
        )
    with pytest.raises(pytest.fail.Exception, match=r"p.md:12: `construct-mcp runs sart` does not parse"):
        test_every_construct_mcp_command_of_a_shell_example_parses(
            Block("p.md", 10, "sh", "construct-mcp demo\nconstruct-mcp runs sart\n")
        )
    with pytest.raises(SyntaxError):
        test_every_python_fragment_compiles(Block("p.md", 1, "python", "def f(:\n"))


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"command": "/x/.venv/bin/construct-mcp", "args": ["serve", "--sore", "sqlite"]}, "does not parse"),
        ({"command": "/x/.venv/bin/construct-mcp", "args": ["demo"]}, "is not `serve`"),
        ({"command": "python", "args": ["server.py"]}, "does not run construct-mcp"),
        ({"command": "construct-mcp", "args": ["serve"], "env": {"CONSTRUCT_WORKERS": "2"}}, "no setting"),
        ({"command": "construct-mcp", "args": ["serve"], "env": {"CONSTRUCT_MAX_ATTEMPTS": "x"}}, "number"),
        ({"type": "stdio"}, "neither a command nor a url"),
    ],
)
def test_a_host_entry_that_would_not_start_is_refused(
    tmp_path: Path, entry: dict[str, Any], problem: str
) -> None:
    for key in ("mcpServers", "servers"):  # Claude Desktop / Cursor, and VS Code
        with pytest.raises((AssertionError, pytest.fail.Exception, ConfigError), match=problem):
            _check_host_config({key: {"construct": entry}}, "p.md:1", tmp_path)


def test_host_entries_of_every_form_the_docs_show_are_accepted(tmp_path: Path) -> None:
    _check_host_config(
        {
            "servers": {
                "venv": {"type": "stdio", "command": "/abs/.venv/bin/construct-mcp", "args": ["serve"]},
                "uvx": {"command": "uvx", "args": ["--from", "dist/x.whl", "construct-mcp", "serve"]},
                "pkg": {"command": "uvx", "args": ["--from", "construct-mcp", "construct-mcp", "serve"]},
                "windows": {
                    "command": "C:\\Users\\you\\construct-mcp\\.venv\\Scripts\\construct-mcp.exe",
                    "args": ["serve"],
                },
                "http": {"type": "http", "url": "http://127.0.0.1:8000/mcp"},
                "env": {
                    "command": "construct-mcp",
                    "args": ["serve", "--log-level", "DEBUG"],
                    "env": {"CONSTRUCT_WORKER_BACKEND": "provider", "OTEL_SDK_DISABLED": "true"},
                },
            }
        },
        "p.md:1",
        tmp_path,
    )
