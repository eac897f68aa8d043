"""Which store the settings choose: ``--store`` > the config file's ``store`` >
``CONSTRUCT_ORCHESTRATION_STORE`` > the deployment mode > filesystem, with the database URL of the
bare name ``postgres`` (``CONSTRUCT_DATABASE_URL`` over ``DATABASE_URL``), handed to :mod:`stores`
(resolved once: the stores read no environment)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from orchestration.errors import ConfigError
from server.settings.config import Settings, load_settings
from server.settings.storage import open_run_store, store_choice, store_inputs, store_url

SECRET = "s3cr3t-pa55"


def settings_with(tmp_path: Path, explicit: str | None, config: str | None, env: dict[str, str]) -> Settings:
    """The settings of ``--store explicit``, a config file whose ``store`` is ``config`` (no file
    when None or empty: the file's ``store = ""`` is an error of its own) and ``env``."""
    file = None
    if config:
        file = tmp_path / "construct.toml"
        file.write_text(f"store = {config!r}\n")
    return load_settings({"store": explicit}, env=env, home=tmp_path, config_file=file)


@pytest.mark.parametrize(
    ("explicit", "config", "env", "expected"),
    [
        ("sqlite", "memory", {"CONSTRUCT_ORCHESTRATION_STORE": "postgres"}, ("sqlite", "--store")),
        (None, "memory", {"CONSTRUCT_ORCHESTRATION_STORE": "sqlite"}, ("memory", "config")),
        (
            None,
            None,
            {"CONSTRUCT_ORCHESTRATION_STORE": "sqlite", "CONSTRUCT_DEPLOYMENT_MODE": "team"},
            ("sqlite", "CONSTRUCT_ORCHESTRATION_STORE"),
        ),
        (None, None, {"CONSTRUCT_DEPLOYMENT_MODE": "solo"}, ("filesystem", "CONSTRUCT_DEPLOYMENT_MODE")),
        (None, None, {"CONSTRUCT_DEPLOYMENT_MODE": "team"}, ("postgres", "CONSTRUCT_DEPLOYMENT_MODE")),
        (None, None, {"CONSTRUCT_DEPLOYMENT_MODE": "Enterprise"}, ("postgres", "CONSTRUCT_DEPLOYMENT_MODE")),
        (None, None, {}, ("filesystem", "default")),
        ("  ", "", {"CONSTRUCT_ORCHESTRATION_STORE": " "}, ("filesystem", "default")),
        (None, None, {"CONSTRUCT_ORCHESTRATION_STORE": " "}, ("filesystem", "default")),
    ],
)
def test_precedence(
    tmp_path: Path, explicit: str | None, config: str | None, env: dict[str, str], expected: tuple[str, str]
) -> None:
    assert store_choice(settings_with(tmp_path, explicit, config, env)) == expected


def test_an_unknown_deployment_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'solo', 'team' or 'enterprise'") as caught:
        load_settings(env={"CONSTRUCT_DEPLOYMENT_MODE": "galaxy"})
    assert (caught.value.file, caught.value.field) == ("environment", "CONSTRUCT_DEPLOYMENT_MODE")


def test_the_database_url_is_construct_database_url_else_database_url(tmp_path: Path) -> None:
    both = {"CONSTRUCT_DATABASE_URL": "postgresql://a/one", "DATABASE_URL": "postgresql://b/two"}
    assert load_settings(env=both, home=tmp_path).database_url == "postgresql://a/one"
    only = {"DATABASE_URL": "postgresql://b/two", "CONSTRUCT_DATABASE_URL": ""}
    settings = load_settings(env=only, home=tmp_path)
    assert (settings.database_url, settings.source_of("database_url")) == (
        "postgresql://b/two",
        "DATABASE_URL",
    )
    config = tmp_path / "construct.toml"
    config.write_text('database_url = "postgresql://c/three"\n')
    assert load_settings(env=both, home=tmp_path).database_url == "postgresql://c/three"
    assert load_settings(env={}, home=tmp_path / "none").database_url is None


def test_migrate_is_given_the_url_of_the_postgres_name(tmp_path: Path) -> None:
    team = {"CONSTRUCT_DEPLOYMENT_MODE": "team", "DATABASE_URL": "postgresql://b/two"}
    assert store_url(load_settings(env=team, home=tmp_path)) == "postgresql://b/two"
    # Without a URL the name stays, and opening it says what is missing.
    assert store_url(load_settings(env={"CONSTRUCT_DEPLOYMENT_MODE": "team"}, home=tmp_path)) == "postgres"
    assert store_url(load_settings({"store": "sqlite"}, env=team, home=tmp_path)) == "sqlite"


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_the_settings_reach_the_store_they_name(tmp_path: Path) -> None:
    url = f"postgresql://construct:{SECRET}@127.0.0.1:{closed_port()}/construct"
    env = {"CONSTRUCT_DEPLOYMENT_MODE": "team", "DATABASE_URL": url, "CONSTRUCT_HOME": str(tmp_path)}
    settings = load_settings(env=env)
    assert store_inputs(settings) == {
        "spec": "postgres",
        "source": "CONSTRUCT_DEPLOYMENT_MODE",
        "database_url": url,
        "pool_size": 10,
    }
    opened = await open_run_store(settings)
    try:
        assert opened.store.name == "filesystem"
        assert opened.description.endswith("from CONSTRUCT_DEPLOYMENT_MODE)")
        [warning] = opened.warnings
        assert "construct:***@127.0.0.1" in warning and SECRET not in warning
    finally:
        await opened.store.close()
