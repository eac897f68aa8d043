"""Say where you are (issue 26): the CLI names the store it opened and says when it was created
just now (a mistyped or relative home otherwise looks like a store with no runs); a relative
``--home`` is shown as the absolute directory it means; a home that can hold no state (a file, an
unwritable directory, a relative ``CONSTRUCT_HOME``) is refused at startup in one line, exit 2; a
home holding a SQLite store is not read as an empty filesystem store; a server whose default
backend is ``provider`` without an API key warns at startup and in the ``instructions`` a host
receives."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from orchestration.errors import ConfigError
from server.app import instructions_for
from server.cli.main import run
from server.mcp.server_card import INSTRUCTIONS
from server.settings.config import load_settings, resolve_home
from server.settings.providers import missing_key_warning


def test_an_empty_runs_list_names_its_store_and_says_it_was_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "mistyped"
    out = io.StringIO()
    assert run(["runs", "list", "--home", str(home)], out) == 0
    assert (
        out.getvalue() == f"no runs in the store filesystem (file://{home}, from default, created just now)\n"
    )
    assert "did not exist before; if you expected runs here, check --store and CONSTRUCT_HOME" in (
        capsys.readouterr().err
    )
    out = io.StringIO()
    assert run(["runs", "list", "--home", str(home)], out) == 0
    assert out.getvalue() == f"no runs in the store filesystem (file://{home}, from default)\n"
    assert capsys.readouterr().err == ""


def test_json_output_stays_json_and_the_note_goes_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    assert run(["runs", "list", "--home", str(tmp_path / "h"), "--store", "sqlite", "--json"], out) == 0
    assert out.getvalue().startswith("{")
    assert f"sqlite (sqlite:///{tmp_path / 'h' / 'construct.db'}" in capsys.readouterr().err


def test_a_relative_home_flag_is_the_absolute_directory_it_means(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_home("rel", {}) == tmp_path / "rel"
    assert resolve_home("~/x", {}) == Path.home() / "x"
    assert resolve_home(None, {"CONSTRUCT_HOME": "~/x"}) == Path.home() / "x"


def test_a_relative_construct_home_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A host starts the server in a directory of its choosing: the variable must not depend on it.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        resolve_home(None, {"CONSTRUCT_HOME": "rel"})
    assert str(raised.value) == (
        "environment: CONSTRUCT_HOME: 'rel' is a relative path; give an absolute one "
        f"(such as {tmp_path}/rel)"
    )
    assert not (tmp_path / "rel").exists()


@pytest.mark.parametrize("named", ["env", "flag"])
def test_a_home_that_is_a_file_is_refused_at_startup_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], named: str
) -> None:
    file = tmp_path / "home"
    file.write_text("not a directory")
    monkeypatch.setenv("CONSTRUCT_HOME", str(file) if named == "env" else str(tmp_path))
    flag = ["--home", str(file)] if named == "flag" else []
    where = "environment: CONSTRUCT_HOME" if named == "env" else "command line: --home"
    for argv in (["runs", "list"], ["runs", "start", "x"], ["migrate", "--check"]):
        assert run([*argv, *flag], io.StringIO()) == 2
        assert capsys.readouterr().err == (
            f"construct-mcp: configuration error: {where}: {file} is a file, not a directory\n"
        )
    under = file / "sub"
    with pytest.raises(ConfigError, match=f"{under} cannot be created: {file} is a file"):
        load_settings(env={"CONSTRUCT_HOME": str(under)})


def test_an_unwritable_home_is_refused_when_it_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # Faked: the tests may run as root, whom no permission bit stops.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    with pytest.raises(
        ConfigError, match=f"^environment: CONSTRUCT_HOME: {locked} is not writable by this user$"
    ):
        load_settings(env={"CONSTRUCT_HOME": str(locked)})
    with pytest.raises(ConfigError, match=f"{locked / 'a'} cannot be created: {locked} is not writable"):
        load_settings(home=locked / "a", env={})
    # The default home is not checked for it: a server on a database store may run where ~ is not
    # writable (a container's HOME).
    monkeypatch.setenv("HOME", str(locked))
    assert load_settings(env={}).home == locked / ".construct"


def test_a_home_holding_a_sqlite_store_is_not_read_as_an_empty_filesystem_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "demo"
    assert run(["runs", "start", "x", "--home", str(home), "--store", "sqlite"], io.StringIO()) == 0
    capsys.readouterr()
    for argv in (["runs", "list"], ["runs", "status", "run-x"], ["runs", "export", "run-x"]):
        assert run([*argv, "--home", str(home)], io.StringIO()) == 2
        assert capsys.readouterr().err == (
            f"construct-mcp: {home} holds a SQLite store (construct.db), not a filesystem store: name it "
            "with --store sqlite (or set CONSTRUCT_ORCHESTRATION_STORE=sqlite)\n"
        )
    assert not (home / "runs").exists()  # no empty filesystem store was made beside it
    out = io.StringIO()
    assert run(["runs", "list", "--home", str(home), "--store", "sqlite"], out) == 0
    assert "awaiting_host" in out.getvalue()
    # A store named as filesystem is the one meant.
    assert run(["runs", "list", "--home", str(home), "--store", "filesystem"], io.StringIO()) == 0


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({"CONSTRUCT_WORKER_BACKEND": "provider"}, "no API key is set for anthropic or openrouter or openai"),
        ({"CONSTRUCT_WORKER_BACKEND": "provider", "OPENROUTER_API_KEY": "sk-or-1234567890"}, None),
        (
            {"CONSTRUCT_WORKER_BACKEND": "provider", "CONSTRUCT_MODEL": "claude-sonnet-4-5"},
            "ANTHROPIC_API_KEY",
        ),
        (
            {
                "CONSTRUCT_WORKER_BACKEND": "provider",
                "CONSTRUCT_MODEL": "claude-sonnet-4-5",
                "OPENROUTER_API_KEY": "sk-or-1234567890",
            },
            "no API key is set for anthropic: set ANTHROPIC_API_KEY",
        ),
        (
            {"CONSTRUCT_WORKER_BACKEND": "provider", "CONSTRUCT_OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"},
            None,
        ),
        ({"CONSTRUCT_WORKER_BACKEND": "inline"}, None),
        ({}, None),
    ],
)
def test_a_provider_backend_without_a_key_is_warned_of_at_startup(
    tmp_path: Path, env: dict[str, str], warned: str | None
) -> None:
    settings = load_settings(env=env, home=tmp_path)
    warning = missing_key_warning(settings)
    if warned is None:
        assert warning is None and instructions_for(settings) == INSTRUCTIONS
        return
    assert warning is not None and warned in warning
    assert instructions_for(settings) == f"{INSTRUCTIONS}\nWarning: {warning}."
    for value in env.values():
        if value.startswith("sk-"):
            assert value not in warning  # a key never appears in a message


def test_an_error_in_a_new_store_keeps_its_code_line_first_and_then_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["runs", "status", "run-x123", "--home", str(tmp_path / "typo")], io.StringIO()) == 1
    first, second = capsys.readouterr().err.splitlines()
    assert first.startswith("run_not_found: ")
    assert second.startswith(f"construct-mcp: note: the store filesystem (file://{tmp_path / 'typo'}")
