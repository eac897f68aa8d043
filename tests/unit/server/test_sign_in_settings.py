"""The run pages' sign-in through the ``[auth]`` issuer, without a network: its settings (the page_
keys of ``[auth]``, the client secret read from the environment and kept out of ``repr``), the
server-side sessions (expiry, sign-out, the bound), where a sign-in may come back to, and a started
sign-in (its redirect, its cookies on https, its pending state).
tests/acceptance/test_page_sign_in.py runs the whole flow against a real issuer."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from starlette.requests import Request

from orchestration.errors import ConfigError
from server.identity import Caller
from server.settings.config import load_settings
from server.settings.oauth import AuthTable
from server.transports.jwt_adapter import IssuerKeys, JwtVerifier
from server.transports.resource_server import OAuthResource
from server.web.sign_in import PENDING_SECONDS, PageSessions, PageSignIn, return_path

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


class Metadata(IssuerKeys):
    """The issuer's metadata without fetching it."""

    def __init__(self) -> None:
        super().__init__(ISSUER, cache_seconds=1, cooldown_seconds=0)

    async def metadata(self) -> dict[str, Any]:
        return {"authorization_endpoint": f"{ISSUER}/authorize?tenant=t", "token_endpoint": f"{ISSUER}/token"}


def signing(clock: Clock) -> PageSignIn:
    table = AuthTable.model_validate({"issuer": ISSUER, "audience": AUDIENCE, "page_client_id": "pages"})
    verifier = JwtVerifier(Metadata(), audience=AUDIENCE, leeway_seconds=0)
    return PageSignIn(OAuthResource(table, verifier), None, clock=clock)


def get(path: str, cookies: dict[str, str] | None = None) -> Request:
    cookie = "; ".join(f"{k}={v}" for k, v in (cookies or {}).items()).encode()
    path, _, query = path.partition("?")
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode()}
    return Request({**scope, "headers": [(b"cookie", cookie)]})


async def test_a_started_sign_in_on_https_and_its_pending_state() -> None:
    clock = Clock()
    sign_in = signing(clock)
    started = await sign_in.start(get("/runs"), "/runs/run_1")
    assert started.status_code == 303
    location = urlsplit(started.headers["location"])
    asked = {k: v[0] for k, v in parse_qs(location.query).items()}
    # The endpoint's own query is kept; the redirect URI is the audience's origin.
    assert asked["tenant"] == "t" and asked["redirect_uri"] == "https://construct.example/runs/callback"
    assert asked["code_challenge_method"] == "S256" and asked["resource"] == AUDIENCE
    # On https: the __Host- cookies, Secure.
    (binding,) = started.headers.getlist("set-cookie")
    assert binding.startswith("__Host-construct-sign-in=") and "Secure" in binding and "HttpOnly" in binding
    assert "samesite=lax" in binding.lower() and "Path=/" in binding and "Domain" not in binding
    assert sign_in.session_cookie == "__Host-construct-runs"
    # A second sign-in in the same browser keeps its binding (two tabs may sign in at once).
    value = binding.split(";", 1)[0].split("=", 1)[1]
    again = await sign_in.start(get("/runs", {"__Host-construct-sign-in": value}), "/runs")
    assert again.headers["set-cookie"].split(";", 1)[0].endswith("=" + value)
    # A state older than PENDING_SECONDS is dropped when the next sign-in starts.
    clock.now += PENDING_SECONDS + 1
    await sign_in.start(get("/runs"), "/runs")
    refused = await sign_in.callback(get(f"/runs/callback?code=c&state={asked['state']}", {}))
    assert refused.status_code == 400 and b"unknown or was used" in refused.body
