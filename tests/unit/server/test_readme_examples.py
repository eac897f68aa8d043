"""Every TOML and JSON example of the README is what it claims (issue 26: three of its TOML blocks
were not TOML at all, inline tables split across lines, and a copied example failed with "Invalid
initial character for a key part"): each ``toml`` block is a whole ``construct.toml`` that the
server's settings and the catalog load; each ``json`` block parses; the block shown as the built-in
``review-loop`` is the built-in chain."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from orchestration.chains import Catalog
from server.cli.main import build_parser
from server.settings.config import load_settings

README = Path(__file__).resolve().parents[3] / "README.md"
_BLOCK = re.compile(r"^```(toml|json)\n(.*?)^```", re.S | re.M)


def _blocks(kind: str) -> list[tuple[int, str]]:
    text = README.read_text("utf-8")
    found = [
        (text[: m.start()].count("\n") + 1, m.group(2)) for m in _BLOCK.finditer(text) if m.group(1) == kind
    ]
    assert found, f"the README has no {kind} block: the pattern is out of date"
    return found


@pytest.mark.parametrize(
    ("line", "body"), _blocks("toml"), ids=lambda v: f"README.md:{v}" if isinstance(v, int) else ""
)
def test_every_toml_example_loads_as_a_config_file(tmp_path: Path, line: int, body: str) -> None:
    tomllib.loads(body)  # valid TOML first: the error then names the line a reader copied
    config = tmp_path / "construct.toml"
    config.write_text(body, "utf-8")
    for persona in re.findall(r'persona_file\s*=\s*"([^"]+)"', body):
        (tmp_path / persona).write_text("You are a specialist of the example.\n", "utf-8")
    load_settings(env={}, home=tmp_path, config_file=config)
    Catalog.load(config)


@pytest.mark.parametrize(
    ("line", "body"), _blocks("json"), ids=lambda v: f"README.md:{v}" if isinstance(v, int) else ""
)
def test_every_json_example_parses(line: int, body: str) -> None:
    json.loads(body)


def test_the_review_loop_the_readme_shows_is_the_built_in_one(tmp_path: Path) -> None:
    (shown,) = [body for _, body in _blocks("toml") if body.startswith("[chains.review-loop]")]
    config = tmp_path / "construct.toml"
    config.write_text(shown, "utf-8")
    assert Catalog.load(config).resolve("review-loop") == Catalog.builtin().resolve("review-loop")


def test_the_host_entries_of_mcp_json_example_start_a_server_the_cli_accepts(tmp_path: Path) -> None:
    """Every entry of ``mcp.json.example`` runs ``construct-mcp`` with arguments its parser takes and an
    environment of variables the README's table documents and the settings accept (issue 26: an
    entry named ``--store sqlite`` while the CLI, on the same home, read the filesystem store)."""
    example = json.loads((README.parent / "mcp.json.example").read_text("utf-8"))
    documented = README.read_text("utf-8")
    for name, entry in example["mcpServers"].items():
        assert entry["command"].endswith("/.venv/bin/construct-mcp"), name
        args = build_parser().parse_args(entry["args"])
        assert (args.command, args.store) == ("serve", None), name  # the store the CLI reads too
        for variable in entry["env"]:
            assert f"| `{variable}` |" in documented, (name, variable)
        load_settings(env={**entry["env"], "CONSTRUCT_HOME": str(tmp_path)})
