"""Server settings: precedence (flags > config file > env > defaults), errors that name their source,
the provider settings built from them, the store inputs, and the log line format."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from orchestration.errors import ConfigError
from server.settings.config import load_settings
from server.settings.logs import LineFormatter, configure_logging
from server.settings.providers import provider_settings
from server.settings.storage import store_inputs


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path)})
    assert settings.home == tmp_path
    assert settings.config_file is None
    assert (settings.lease_ttl_seconds, settings.dispatch_concurrency, settings.poll_seconds) == (
        30.0,
        4,
        1.0,
    )
    assert settings.recover_on_start is True and settings.store_fallback is True
    assert settings.worker_backend == "inline" and settings.log_level == "INFO"
    assert settings.store is None and settings.sources == {}


def test_home_defaults_to_dot_construct(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_settings(env={}).home == tmp_path / ".construct"


def test_flags_beat_the_file_which_beats_the_environment(tmp_path: Path) -> None:
    write(tmp_path / "construct.toml", 'store = "sqlite"\nlease_ttl_seconds = 12\nlog_level = "debug"\n')
    env = {
        "CONSTRUCT_HOME": str(tmp_path),
        "CONSTRUCT_ORCHESTRATION_STORE": "memory",
        "CONSTRUCT_LEASE_TTL_SECONDS": "5",
        "CONSTRUCT_POLL_SECONDS": "0.5",
        "CONSTRUCT_RECOVER_ON_START": "false",
    }
    settings = load_settings(env=env)
    assert settings.config_file == tmp_path / "construct.toml"
    assert settings.store == "sqlite" and settings.source_of("store") == "config"
    assert settings.lease_ttl_seconds == 12 and settings.log_level == "DEBUG"
    assert settings.poll_seconds == 0.5 and settings.source_of("poll_seconds") == "CONSTRUCT_POLL_SECONDS"
    assert settings.recover_on_start is False
    flagged = load_settings({"store": "filesystem", "log_level": None}, env=env)
    assert flagged.store == "filesystem" and flagged.source_of("store") == "--store"
    assert flagged.log_level == "DEBUG"  # a flag left out (None) does not count


def test_an_explicit_config_file_replaces_the_one_in_home(tmp_path: Path) -> None:
    write(tmp_path / "construct.toml", "dispatch_concurrency = 2\n")
    other = write(tmp_path / "other.toml", "dispatch_concurrency = 9\n")
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path)}, config_file=other)
    assert settings.dispatch_concurrency == 9 and settings.config_file == other
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(env={"CONSTRUCT_HOME": str(tmp_path)}, config_file=tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("CONSTRUCT_LEASE_TTL_SECONDS", "soon", "must be a number"),
        ("CONSTRUCT_LEASE_TTL_SECONDS", "0", "must be at least 1"),
        ("CONSTRUCT_DISPATCH_CONCURRENCY", "0", "must be at least 1"),
        ("CONSTRUCT_POLL_SECONDS", "-1", "must be more than 0"),
        ("CONSTRUCT_RECOVER_ON_START", "perhaps", "must be true or false"),
        ("CONSTRUCT_MAX_REQUEST_CHARS", "many", "must be a whole number"),
        ("CONSTRUCT_MAX_OUTPUT_CHARS", "0", "must be at least 1"),
        ("CONSTRUCT_LOG_LEVEL", "loud", "'DEBUG'"),
        ("CONSTRUCT_DEPLOYMENT_MODE", "galaxy", "'solo'"),
        ("CONSTRUCT_WORKER_BACKEND", "magic", "'inline'"),
        ("CONSTRUCT_FAULT_CRASH_AFTER_WRITES", "0", "must be at least 1"),
    ],
)
def test_a_bad_environment_variable_is_named(variable: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={variable: value})
    assert caught.value.file == "environment"
    assert caught.value.field == variable
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("dispatch_concurrency = 'lots'\n", "dispatch_concurrency", "must be a whole number"),
        ("stoer = 'memory'\n", "stoer", "unknown setting (did you mean 'store'?)"),
        ("chians = 1\n", "chians", "unknown setting (did you mean 'chains'?)"),
        ("zzzz = 1\n", "zzzz", "unknown setting; the known settings are: a2a, agents, auth, auth_token"),
        ("fault_crash_after_writes = 3\n", "fault_crash_after_writes", "only be set in the environment"),
        ("openai_base_url = 'http://x'\n", "openai_base_url", "[providers.openai]"),
        ("[providers.bogus]\napi_key = 'k'\n", "providers.bogus", "'anthropic'"),
        ("[providers.openai]\napi_kee = 'k'\n", "providers.openai.api_kee", "(did you mean 'api_key'?)"),
        ("[providers.openai]\nqqq = 'k'\n", "providers.openai.qqq", "takes: base_url, api_key"),
        ("this is not toml", "(file)", "not valid TOML"),
    ],
)
def test_a_bad_config_file_names_file_field_and_problem(
    tmp_path: Path, text: str, field: str, problem: str
) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, config_file=path)
    assert (caught.value.file, caught.value.field) == (str(path), field)
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"{path}: {field}: ")


def test_catalog_tables_are_left_to_the_catalog(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", 'max_request_chars = 10\n[chains.x]\nsteps = ["writer"]\n')
    assert load_settings(env={}, config_file=path).limits().max_request_chars == 10


def test_provider_settings_from_config_and_environment(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        'model = "claude-test"\nmax_attempts = 5\n'
        '[providers.anthropic]\napi_key = "sk-from-config"\nmax_concurrency = 2\n',
    )
    env = {
        "ANTHROPIC_API_KEY": "sk-from-env",
        "OPENROUTER_API_KEY": "or-key",
        "CONSTRUCT_PROVIDER": "anthropic",
    }
    settings = load_settings(env=env, config_file=path)
    assert "sk-from-config" not in repr(settings)
    providers = provider_settings(settings)
    anthropic = providers.endpoints["anthropic"]
    assert anthropic.api_key == "sk-from-config" and anthropic.max_concurrency == 2
    assert anthropic.key_source == "[providers.anthropic] in the config file"
    assert "sk-from-config" not in repr(anthropic)
    assert providers.endpoints["openrouter"].api_key == "or-key"
    assert providers.endpoints["openrouter"].key_source == "OPENROUTER_API_KEY"
    assert providers.endpoints["openai"].api_key is None
    assert (providers.default_provider, providers.default_model, providers.max_attempts) == (
        "anthropic",
        "claude-test",
        5,
    )
    assert providers.compat_provider == "openrouter"


def test_an_openai_compatible_base_url_routes_other_models_to_it() -> None:
    settings = load_settings(env={"CONSTRUCT_OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"})
    providers = provider_settings(settings)
    assert providers.endpoints["openai"].base_url == "http://127.0.0.1:8080/v1"
    assert providers.compat_provider == "openai"
    assert providers.infer_provider("llama-3") == "openai"
    openrouter = load_settings(env={"CONSTRUCT_OPENAI_BASE_URL": "https://openrouter.ai/api"})
    assert provider_settings(openrouter).compat_provider == "openrouter"


def test_store_inputs_keep_the_source_of_the_store(tmp_path: Path) -> None:
    env = {"CONSTRUCT_ORCHESTRATION_STORE": "memory", "CONSTRUCT_DATABASE_URL": "postgresql://u:pw@h/db"}
    assert store_inputs(load_settings(env=env)) == {
        "spec": "memory",
        "source": "CONSTRUCT_ORCHESTRATION_STORE",
        "database_url": "postgresql://u:pw@h/db",
        "pool_size": 10,
    }
    flagged = store_inputs(load_settings({"store": "sqlite"}, env=env))
    assert (flagged["spec"], flagged["source"]) == ("sqlite", "--store")
    path = write(tmp_path / "c.toml", 'store = "filesystem"\ndeployment_mode = "team"\n')
    inputs = store_inputs(load_settings(env={}, config_file=path))
    assert (inputs["spec"], inputs["source"]) == ("filesystem", "config")
    # The file's deployment mode counts too, when no store is named.
    path = write(tmp_path / "c.toml", 'deployment_mode = "team"\n')
    inputs = store_inputs(load_settings(env={}, config_file=path))
    assert (inputs["spec"], inputs["source"]) == ("postgres", "CONSTRUCT_DEPLOYMENT_MODE")


def test_log_lines_are_single_lines_with_the_action() -> None:
    record = logging.LogRecord("construct.x", logging.WARNING, __file__, 1, "two\nlines %s", ("here",), None)
    record.action = "something_happened"
    record.run_id = "run-1"
    line = LineFormatter().format(record)
    assert "\n" not in line
    assert " WARNING construct.x action=something_happened run_id=run-1 two\\nlines here" in line


def test_configure_logging_writes_to_the_given_stream_only() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("INFO", stream)
        logging.getLogger("construct.test").info("hello", extra={"action": "greeting"})
        assert "action=greeting hello" in stream.getvalue()
        assert len(root.handlers) == 1
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
