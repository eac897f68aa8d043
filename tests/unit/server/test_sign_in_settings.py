"""The run pages' sign-in through the ``[auth]`` issuer, without a network: its settings (the page_
keys of ``[auth]``, the client secret read from the environment and kept out of ``repr``), the
server-side sessions (expiry, sign-out, the bound) and where a sign-in may come back to.
tests/acceptance/test_page_sign_in.py runs the whole flow against a real issuer."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.errors import ConfigError
from server.identity import Caller
from server.settings.config import load_settings
from server.web.sign_in import PageSessions, return_path

ISSUER = "https://idp.example"
AUDIENCE = "https://construct.example/mcp"
SECRET = "the-page-client-secret-" + "9e41b7"


def auth(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    (tmp_path / "c.toml").write_text(f'[auth]\nissuer = "{ISSUER}"\naudience = "{AUDIENCE}"\n{text}\n')
    return str(tmp_path / "c.toml")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("page_session_seconds = 600", "set page_client_id"),
        ('page_client_id = "c"\npage_redirect_path = "/callback"', "must be a path under /runs/"),
        ('page_client_id = "c"\npage_redirect_path = "/runs/api/cb"', "other than /runs/api"),
        ('page_client_id = "c"\npage_redirect_path = "/runs/sign-out"', "must be a path under /runs/"),
        ('page_client_id = "c"\npage_client_secret_env = "A SECRET"', "must name an environment variable"),
        ('page_client_id = "c"\npage_session_seconds = 86400', "must be at most 28800"),
        ('page_client_id = "c"\npage_scopes = ["openid email"]', "without spaces"),
    ],
)
def test_a_bad_page_setting_is_a_config_error(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, config_file=Path(auth(tmp_path, text)))
    assert caught.value.field.startswith("auth")
    assert problem in caught.value.problem


def test_the_page_client_and_its_redirect_uri(tmp_path: Path) -> None:
    settings = load_settings(env={}, config_file=Path(auth(tmp_path, 'page_client_id = "construct-runs"')))
    table = settings.auth
    assert table.page_sign_in and table.page_client_id == "construct-runs"
    assert table.redirect_uri == "https://construct.example/runs/callback"
    assert table.page_session_seconds == 900
    assert table.scopes_asked() == ["openid", "construct:approve", "construct:operate", "construct:read"]
    assert settings.page_secret() is None  # a public client
    without = load_settings(env={}, config_file=Path(auth(tmp_path, "")))
    assert without.auth.enabled and not without.auth.page_sign_in


def test_a_confidential_clients_secret_comes_from_the_environment_only(tmp_path: Path) -> None:
    file = Path(auth(tmp_path, 'page_client_id = "c"\npage_client_secret_env = "PAGE_SECRET"'))
    settings = load_settings(env={"PAGE_SECRET": f" {SECRET}\n"}, config_file=file)
    assert settings.page_secret() == SECRET
    assert SECRET not in repr(settings) and SECRET not in repr(settings.auth)
    # Not set: an error when the HTTP transport asks for it, naming the variable, not a value.
    unset = load_settings(env={}, config_file=file)
    with pytest.raises(ConfigError) as caught:
        unset.page_secret()
    assert caught.value.field == "auth.page_client_secret_env"
    assert "PAGE_SECRET is not set" in caught.value.problem


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def caller(identity: str) -> Caller:
    return Caller(
        identity=identity, roles=frozenset({"read"}), own_runs_only=False, channel="http", verified=True
    )


def test_sessions_end_at_their_expiry_at_sign_out_and_past_the_bound() -> None:
    clock = Clock()
    sessions = PageSessions(clock, max_sessions=2)
    erin = sessions.open(caller("erin"), expires_at=1060.0)
    assert sessions.find(erin) == caller("erin") and sessions.find("x" * 43) is None
    clock.now = 1060.0
    assert sessions.find(erin) is None  # expired: gone
    fred = sessions.open(caller("fred"), expires_at=2000.0)
    assert sessions.close(fred) == caller("fred")
    assert sessions.find(fred) is None and sessions.close(fred) is None  # signed out: a replay finds nothing
    first, second = (sessions.open(caller(name), expires_at=2000.0) for name in ("g", "h"))
    third = sessions.open(caller("i"), expires_at=2000.0)  # over the bound: the oldest makes room
    assert sessions.find(first) is None
    assert sessions.find(second) == caller("h") and sessions.find(third) == caller("i")


def test_where_a_sign_in_comes_back_to() -> None:
    assert return_path("/runs") == "/runs"
    assert return_path("/runs/run_01J9ZX4") == "/runs/run_01J9ZX4"
    for elsewhere in (
        "",
        "/mcp",
        "//evil.example/runs",
        "/runs/sign-in",
        "/runs/a/b",
        "https://evil.example",
    ):
        assert return_path(elsewhere) == "/runs", elsewhere
