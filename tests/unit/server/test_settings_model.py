"""The settings model (server/settings/config.py on pydantic-settings): the precedence of its
sources (flag > file > environment > default), what each source reads, a bad value's coded error
(the reference page rendered from the model: tests/unit/docs/test_config_reference.py); and the one
other reading of the environment, an agent's token at call time."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.errors import ConfigError
from orchestration.workers import KEY_VARIABLES
from orchestration.workers.mcp_agents import token_from_environment
from server.settings.config import ENV_VARS, Settings, load_settings
from server.settings.sources import ConfigFileSource, EnvironmentSource, FlagSource


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "construct.toml"
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------- precedence


def test_a_flag_beats_the_file_which_beats_the_environment_which_beats_the_default(tmp_path: Path) -> None:
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_MAX_ATTEMPTS": "4"}
    assert load_settings(env={"CONSTRUCT_HOME": str(tmp_path)}).max_attempts == 3
    assert load_settings(env=env).max_attempts == 4
    config(tmp_path, "max_attempts = 5\n")
    assert load_settings(env=env).max_attempts == 5
    flagged = load_settings({"max_attempts": 6}, env=env)
    assert flagged.max_attempts == 6
    assert flagged.source_of("max_attempts") == "--max-attempts"
    assert load_settings(env=env).source_of("max_attempts") == "config"
    other = tmp_path / "other.toml"
    other.write_text("")  # an explicit file replaces home's: the variable counts again
    assert load_settings(env=env, config_file=other).source_of("max_attempts") == "CONSTRUCT_MAX_ATTEMPTS"


def test_a_bad_value_is_refused_even_where_a_higher_source_overrides_it(tmp_path: Path) -> None:
    config(tmp_path, "max_attempts = 5\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(
            {"max_attempts": 6}, env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_MAX_ATTEMPTS": "x"}
        )
    assert caught.value.code == "config_error"
    assert (caught.value.file, caught.value.field) == ("environment", "CONSTRUCT_MAX_ATTEMPTS")
    assert "must be a whole number" in caught.value.problem


@pytest.mark.parametrize(
    ("flags", "text", "env", "where"),
    [
        ({"max_attempts": 0}, "", {}, ("command line", "--max-attempts")),
        ({}, "max_attempts = 0\n", {}, ("FILE", "max_attempts")),
        ({}, "", {"CONSTRUCT_MAX_ATTEMPTS": "0"}, ("environment", "CONSTRUCT_MAX_ATTEMPTS")),
        ({}, "", {"DATABASE_URL": "x" * 2001}, ("environment", "DATABASE_URL")),
    ],
)
def test_a_bad_value_is_a_config_error_naming_its_source(
    tmp_path: Path, flags: dict[str, object], text: str, env: dict[str, str], where: tuple[str, str]
) -> None:
    path = config(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(flags, env=env, config_file=path)
    assert caught.value.code == "config_error"
    assert (caught.value.file, caught.value.field) == (
        str(path) if where[0] == "FILE" else where[0],
        where[1],
    )


# ------------------------------------------------------------------------------------- each source


def test_the_flag_source_ignores_flags_not_given_and_refuses_unknown_ones() -> None:
    source = FlagSource(Settings, {"store": "sqlite", "log_level": None})
    assert source() == {"store": "sqlite"} and source.labels == {"store": "--store"}
    with pytest.raises(ConfigError, match="unknown setting"):
        FlagSource(Settings, {"home": "/x"})


def test_the_file_source_leaves_the_catalog_tables_and_refuses_what_only_the_environment_sets(
    tmp_path: Path,
) -> None:
    path = config(tmp_path, 'poll_seconds = 0.5\n[chains.x]\nsteps = ["writer"]\n')
    assert ConfigFileSource(Settings, path)() == {"poll_seconds": 0.5}
    with pytest.raises(ConfigError, match=r"write api_key under \[providers.openai\] instead"):
        ConfigFileSource(Settings, config(tmp_path, 'openai_api_key = "k"\n'))
    with pytest.raises(ConfigError, match="unknown setting; the known settings are"):
        ConfigFileSource(Settings, config(tmp_path, 'home = "/x"\n'))
    with pytest.raises(ConfigError, match="does not exist"):
        ConfigFileSource(Settings, tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="cannot be read"):
        ConfigFileSource(Settings, tmp_path)


def test_the_environment_source_reads_only_the_models_variables() -> None:
    environ = {
        "CONSTRUCT_POLL_SECONDS": "0.5",
        "CONSTRUCT_MODEL": "",  # empty: unset
        "CONSTRUCT_DATABASE_URL": "",
        "DATABASE_URL": "postgresql://b/two",  # the second name of database_url
        "OTEL_SERVICE_NAME": "svc",
        "POLL_SECONDS": "9",
        "store": "memory",
        "ANTHROPIC_API_KEY": "  sk-a  ",
    }
    source = EnvironmentSource(Settings, environ)
    assert source() == {
        "poll_seconds": "0.5",
        "database_url": "postgresql://b/two",
        "otel": {"OTEL_SERVICE_NAME": "svc"},
        "anthropic_api_key": "  sk-a  ",
    }
    assert source.labels["database_url"] == "DATABASE_URL"
    settings = load_settings(env=environ)
    assert settings.anthropic_api_key == "sk-a" and "sk-a" not in repr(settings)
    assert settings.otel == {"OTEL_SERVICE_NAME": "svc"}
    # Set but empty is refused for the bearer token (an unset shell variable is not "no token").
    with pytest.raises(ConfigError) as caught:
        EnvironmentSource(Settings, {"CONSTRUCT_AUTH_TOKEN": ""})
    assert caught.value.field == "CONSTRUCT_AUTH_TOKEN"


def test_settings_built_directly_read_no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONSTRUCT_MAX_ATTEMPTS", "7")
    assert Settings(home=tmp_path).max_attempts == 3
    assert load_settings(home=tmp_path).max_attempts == 7  # load_settings reads the process environment


def test_the_provider_key_variables_are_the_models() -> None:
    for provider, variable in KEY_VARIABLES.items():
        assert ENV_VARS[variable] == f"{provider}_api_key"


# ----------------------------------------------------------------------- the one other reading


def test_an_agents_token_is_read_from_the_process_environment_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not at load time: a token rotated while the server runs is used by the next call.
    monkeypatch.delenv("CONSTRUCT_TEST_AGENT_TOKEN", raising=False)
    assert token_from_environment("CONSTRUCT_TEST_AGENT_TOKEN") is None
    monkeypatch.setenv("CONSTRUCT_TEST_AGENT_TOKEN", "tok-1")
    assert token_from_environment("CONSTRUCT_TEST_AGENT_TOKEN") == "tok-1"
    monkeypatch.setenv("CONSTRUCT_TEST_AGENT_TOKEN", "tok-2")
    assert token_from_environment("CONSTRUCT_TEST_AGENT_TOKEN") == "tok-2"
