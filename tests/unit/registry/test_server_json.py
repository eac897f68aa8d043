"""``server.json``, this server's entry for the MCP Registry (docs/publishing.md), is valid and says
what the code says, so it cannot drift: it validates against the registry's schema (restated in
``server.schema.json`` beside this file, which names its source; also against the published file
itself when ``CONSTRUCT_TEST_SERVER_SCHEMA`` names a copy), passes the registry's own checks beyond
the schema (a name it accepts, a GitHub repository URL, URL templates whose variables are defined,
the ``mcp-name`` line PyPI ownership is verified by), carries pyproject's version and name, starts
``construct-mcp serve``, and names only environment variables the settings read, with their secrets
marked secret and their choices the settings' own."""

from __future__ import annotations

import json
import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator  # type: ignore[import-untyped]  # ships no type information

from server.cli.grammar import build_parser
from server.mcp.server_card import SERVER_TITLE
from server.settings.config import ENV_VARS, Settings, load_settings
from server.transports.http import STREAMABLE_HTTP_PATH

ROOT = Path(__file__).resolve().parents[3]
SCHEMA_FILE = Path(__file__).with_name("server.schema.json")
#: The schema version server.json follows: a newer one is a deliberate change of both files.
PUBLISHED_SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"

# The registry's own checks beyond the schema (its validators): a name's two parts start and end
# with a letter or digit; a GitHub repository is https://github.com/OWNER/REPO.
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9.-]*[a-zA-Z0-9]/[a-zA-Z0-9][a-zA-Z0-9._-]*[a-zA-Z0-9]$")
_GITHUB_REPOSITORY = re.compile(r"^https?://(www\.)?github\.com/[\w.-]+/[\w.-]+/?$")
_TEMPLATE_VARIABLE = re.compile(r"\{([^}]+)\}")


def _server_json() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / "server.json").read_text("utf-8"))
    return loaded


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    return project


def _package() -> dict[str, Any]:
    (package,) = _server_json()["packages"]
    assert isinstance(package, dict)
    return package


def _schema_errors(schema: dict[str, Any], instance: object) -> list[str]:
    validator = Draft7Validator(schema, format_checker=Draft7Validator.FORMAT_CHECKER)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(instance)]


# ------------------------------------------------------------------------------------------ schema


def test_server_json_follows_the_registry_schema() -> None:
    schema = json.loads(SCHEMA_FILE.read_text("utf-8"))
    Draft7Validator.check_schema(schema)
    server = _server_json()
    assert server["$schema"] == PUBLISHED_SCHEMA
    assert PUBLISHED_SCHEMA in schema["$comment"]
    assert _schema_errors(schema, server) == []


def test_server_json_follows_the_published_schema_file_when_one_is_given() -> None:
    """The published file itself (not in the checkout: CI has no network), when
    ``CONSTRUCT_TEST_SERVER_SCHEMA`` names a downloaded copy (docs/publishing.md shows how)."""
    path = os.environ.get("CONSTRUCT_TEST_SERVER_SCHEMA")
    if not path:
        pytest.skip("CONSTRUCT_TEST_SERVER_SCHEMA names no copy of the published schema")
    published = json.loads(Path(path).read_text("utf-8"))
    assert published.get("$id") == PUBLISHED_SCHEMA, f"{path} is not the schema server.json names"
    assert _schema_errors(published, _server_json()) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s.update(name="construct-mcp"), "does not match"),
        (lambda s: s.update(description="x" * 101), "is too long"),
        (lambda s: s.pop("version"), "'version' is a required property"),
        (lambda s: s["packages"][0].update(version="latest"), "should not be valid"),
        (lambda s: s["packages"][0]["transport"].update(type="pipe"), "is not valid under any"),
        (lambda s: s["remotes"][0].update(url="{host}/mcp"), "is not valid under any"),
        (lambda s: s["packages"][0]["environmentVariables"][0].pop("name"), "'name' is a required property"),
    ],
)
def test_the_schema_refuses_what_the_registry_refuses(change: Any, problem: str) -> None:
    schema = json.loads(SCHEMA_FILE.read_text("utf-8"))
    server = _server_json()
    change(server)
    errors = _schema_errors(schema, server)
    assert any(problem in error for error in errors), errors


# ---------------------------------------------------------------------- the registry's own checks


def test_the_name_and_repository_are_what_the_registry_accepts_for_one_github_owner() -> None:
    server = _server_json()
    name, repository = server["name"], server["repository"]
    assert _NAME.match(name), name
    assert repository["source"] == "github"
    assert _GITHUB_REPOSITORY.match(repository["url"]), repository["url"]
    # A GitHub login may publish io.github.<login>/*: the namespace is the repository's owner.
    owner = repository["url"].rstrip("/").split("/")[-2]
    assert name == f"io.github.{owner}/{_project()['name']}"


def test_the_readme_carries_the_line_pypi_ownership_is_verified_by() -> None:
    # The registry looks for "mcp-name: NAME" in the package's description on PyPI (the README),
    # followed by a space, a tag, the end of a comment or of the line.
    readme = (ROOT / "README.md").read_text("utf-8")
    assert _project()["readme"] == "README.md"
    name = re.escape(_server_json()["name"])
    assert re.search(rf"mcp-name: {name}(\s|<|-->|$)", readme, re.MULTILINE), "README.md has no mcp-name line"


def test_the_remote_is_the_streamable_http_endpoint_with_its_variables_defined() -> None:
    (remote,) = _server_json()["remotes"]
    assert remote["type"] == "streamable-http"
    url: str = remote["url"]
    assert url.startswith("https://"), "the registry takes only https remotes"
    assert url.endswith(STREAMABLE_HTTP_PATH), url
    assert set(_TEMPLATE_VARIABLE.findall(url)) <= set(remote.get("variables", {})), url
    for header in remote.get("headers", []):
        used = set(_TEMPLATE_VARIABLE.findall(header.get("value", "")))
        assert used <= set(header.get("variables", {})), header["name"]
        if used:
            assert header.get("isSecret") is True, f"{header['name']} carries a token"


# ----------------------------------------------------------------------- what the project says


def test_the_versions_are_pyprojects() -> None:
    version = _project()["version"]
    assert _server_json()["version"] == version
    assert _package()["version"] == version


def test_the_package_is_this_project_on_pypi_started_as_serve() -> None:
    package = _package()
    assert (package["registryType"], package["identifier"]) == ("pypi", _project()["name"])
    # uvx runs the package's command of the same name: construct-mcp, a console script of pyproject.
    assert package["runtimeHint"] == "uvx"
    assert package["identifier"] in _project()["scripts"]
    assert package["transport"] == {"type": "stdio"}
    argv = [argument["value"] for argument in package["packageArguments"]]
    assert build_parser().parse_args(argv).command == "serve"
    assert _server_json()["title"] == SERVER_TITLE


def _variables() -> list[dict[str, Any]]:
    variables: list[dict[str, Any]] = _package()["environmentVariables"]
    return variables


@pytest.mark.parametrize("variable", _variables(), ids=lambda v: str(v["name"]))
def test_every_environment_variable_is_a_setting_as_the_settings_take_it(variable: dict[str, Any]) -> None:
    name = variable["name"]
    assert name in ENV_VARS, f"{name} is no setting of construct-mcp"
    field = Settings.model_fields[ENV_VARS[name]]
    # A field kept out of repr holds a secret (a key, a database URL with its password).
    assert variable.get("isSecret", False) is (field.repr is False), name
    choices = variable.get("choices")
    literals = [a for a in typing.get_args(field.annotation) if a is not type(None)]
    literal = next(
        (typing.get_args(a) for a in [field.annotation, *literals] if typing.get_origin(a) is typing.Literal),
        None,
    )
    if literal is not None or choices is not None:
        assert choices is not None and tuple(choices) == literal, name
    if "default" in variable:
        assert variable["default"] == str(field.default), name


def test_the_example_values_of_the_variables_load(tmp_path: Path) -> None:
    """Each variable's default, placeholder or first choice is a value the settings take."""
    env = {
        v["name"]: v.get("default", v.get("placeholder", (v.get("choices") or ["x"])[0]))
        for v in _variables()
        if not v.get("isSecret")
    }
    env["CONSTRUCT_HOME"] = str(tmp_path)  # the placeholder names someone else's home
    settings = load_settings(env=env)
    assert settings.worker_backend == env["CONSTRUCT_WORKER_BACKEND"]
