"""Named tokens, roles and callers (server/identity.py, the [tokens] tables of server/settings/config.py and
the bearer middleware of server/transports/auth.py) on their own: configuration errors at load time, the
caller each token stands for, and what ``forbidden`` says."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import pytest
from mcp.server.auth.middleware.auth_context import get_access_token
from starlette.types import Message, Receive, Scope, Send

from orchestration.errors import ConfigError, Forbidden
from server.identity import (
    AUTH_TOKEN_IDENTITY,
    LOCAL,
    ROLES,
    SCOPE_KEY,
    UNAUTHENTICATED_HTTP,
    Caller,
    NamedToken,
    caller_for,
    caller_of,
    local_user,
    start_identity,
)
from server.settings.config import load_settings
from server.transports.auth import BearerTokenMiddleware, check_exposure

ALICE = "alice-secret-token-0123456789"
BOB = "bob-secret-token-9876543210"
ADMIN = "admin-secret-token-55555555"


def settings_with(tmp_path: Path, toml: str, env: dict[str, str] | None = None) -> Any:
    (tmp_path / "construct.toml").write_text(toml)
    return load_settings(env=env or {}, home=tmp_path)


def test_named_tokens_load_with_their_roles(tmp_path: Path) -> None:
    settings = settings_with(
        tmp_path,
        f"""
[tokens.alice]
token = "{ALICE}"
roles = ["read", "operate"]

[tokens.bob]
token_env = "BOB_TOKEN"
roles = ["approve", "read"]
own_runs_only = true
""",
        {"BOB_TOKEN": f"  {BOB}\n", "CONSTRUCT_AUTH_TOKEN": ADMIN},
    )
    tokens = {t.identity: t for t in settings.named_tokens()}
    assert set(tokens) == {AUTH_TOKEN_IDENTITY, "alice", "bob"}
    assert tokens[AUTH_TOKEN_IDENTITY].roles == ROLES and tokens[AUTH_TOKEN_IDENTITY].token == ADMIN
    assert tokens["alice"].roles == {"read", "operate"} and not tokens["alice"].own_runs_only
    assert tokens["bob"].token == BOB, "read from the variable, trimmed"
    assert tokens["bob"].roles == {"read", "approve"} and tokens["bob"].own_runs_only
    for secret in (ALICE, BOB, ADMIN):
        assert secret not in repr(settings) and secret not in repr(settings.named_tokens())


@pytest.mark.parametrize(
    ("toml", "env", "field", "problem"),
    [
        (
            f'[tokens.alice]\ntoken = "{ALICE}"\nroles = ["read"]\n'
            f'[tokens.bob]\ntoken = "{ALICE}"\nroles = ["read"]\n',
            {},
            "tokens.bob",
            "same as tokens.alice",
        ),
        (
            f'[tokens.alice]\ntoken = "{ADMIN}"\nroles = ["read"]\n',
            {"CONSTRUCT_AUTH_TOKEN": ADMIN},
            "tokens.alice",
            "same as auth_token",
        ),
        (
            '[tokens.alice]\ntoken_env = "ALICE_TOKEN"\nroles = ["read"]\n'
            '[tokens.bob]\ntoken = "SAME-0123456789-xyz"\nroles = ["read"]\n',
            {"ALICE_TOKEN": "SAME-0123456789-xyz"},
            "tokens.bob",
            "same as tokens.alice",
        ),
        (
            '[tokens.alice]\ntoken = "short-token"\nroles = ["read"]\n',
            {},
            "tokens.alice.token",
            "at least 16",
        ),
        (
            '[tokens.alice]\ntoken_env = "ALICE_TOKEN"\nroles = ["read"]\n',
            {"ALICE_TOKEN": "short-token"},
            "tokens.alice.token_env",
            "at least 16",
        ),
        (
            '[tokens.alice]\ntoken_env = "ALICE_TOKEN"\nroles = ["read"]\n',
            {},
            "tokens.alice.token_env",
            "not set",
        ),
        (f'[tokens.alice]\ntoken = "{ALICE}"\nroles = ["admin"]\n', {}, "tokens.alice.roles[0]", "'operate'"),
        (f'[tokens.alice]\ntoken = "{ALICE}"\nroles = []\n', {}, "tokens.alice.roles", "at least 1"),
        (f'[tokens.alice]\ntoken = "{ALICE}"\n', {}, "tokens.alice.roles", "required"),
        ('[tokens.alice]\nroles = ["read"]\n', {}, "tokens", "exactly one of token and token_env"),
        (
            f'[tokens.alice]\ntoken = "{ALICE}"\nroles = ["read"]\nrole = "x"\n',
            {},
            "tokens.alice.role",
            "did you mean 'roles'?",
        ),
        (
            f'[tokens.alice]\ntoken = "{ALICE}"\nroles = ["read"]\nqqq = "x"\n',
            {},
            "tokens.alice.qqq",
            "takes",
        ),
        (f'[tokens."al ice"]\ntoken = "{ALICE}"\nroles = ["read"]\n', {}, "tokens", "letters, digits"),
        (
            f'[tokens.admin]\ntoken = "{ALICE}"\nroles = ["read"]\n',
            {"CONSTRUCT_AUTH_TOKEN": ADMIN},
            "tokens.admin",
            "name this identity otherwise",
        ),
    ],
)
def test_a_bad_tokens_table_is_a_startup_error_that_never_shows_a_token(
    tmp_path: Path, toml: str, env: dict[str, str], field: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        settings_with(tmp_path, toml, env).named_tokens()
    assert raised.value.field == field, raised.value
    assert problem in raised.value.problem, raised.value
    for secret in (ALICE, ADMIN, "short-token", "SAME-0123456789-xyz"):
        assert secret not in str(raised.value)


def test_the_environment_of_the_tokens_matters_only_where_they_are_used(tmp_path: Path) -> None:
    """stdio and the CLI load the same settings without the HTTP server's token variables."""
    settings = settings_with(tmp_path, '[tokens.alice]\ntoken_env = "ALICE_TOKEN"\nroles = ["read"]\n')
    assert settings.store_fallback  # loaded
    with pytest.raises(ConfigError, match="ALICE_TOKEN is not set"):
        settings.named_tokens()


def test_named_tokens_protect_a_server_bound_beyond_loopback() -> None:
    check_exposure("0.0.0.0", (NamedToken("alice", ALICE),))
    with pytest.raises(ConfigError):
        check_exposure("0.0.0.0", ())


class Recorder:
    def __init__(self) -> None:
        self.scopes: list[Scope] = []
        self.sent: list[Message] = []

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        access = get_access_token()
        assert access is not None and access.client_id == scope[SCOPE_KEY].identity

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def receive() -> Message:
    return {"type": "http.request", "body": b""}


async def test_each_token_lets_its_own_identity_in() -> None:
    tokens = [
        NamedToken("alice", ALICE, frozenset({"read", "operate"})),
        NamedToken("bob", BOB, frozenset({"approve"}), own_runs_only=True),
    ]
    recorder = Recorder()
    guarded = BearerTokenMiddleware(recorder.app, tokens)
    for token, identity in ((ALICE, "alice"), (BOB, "bob")):
        await guarded(
            {"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]},
            receive,
            recorder.send,
        )
        scope = recorder.scopes[-1]
        caller = scope[SCOPE_KEY]
        assert isinstance(caller, Caller)
        assert (caller.identity, caller.channel, caller.verified) == (identity, "http", True)
        # The SDK's user (it binds a Streamable HTTP session to who opened it): no secret in it.
        assert scope["user"].access_token.client_id == identity
        assert token not in scope["user"].access_token.model_dump_json()
    assert recorder.scopes[0][SCOPE_KEY].roles == {"read", "operate"}
    assert recorder.scopes[1][SCOPE_KEY].own_runs_only
    await guarded(
        {"type": "http", "headers": [(b"authorization", b"Bearer " + (ALICE + BOB).encode())]},
        receive,
        recorder.send,
    )
    assert len(recorder.scopes) == 2 and recorder.sent[0]["status"] == 401


async def test_the_single_token_is_the_admin_identity_with_every_role() -> None:
    recorder = Recorder()
    guarded = BearerTokenMiddleware(recorder.app, ADMIN)
    await guarded(
        {"type": "http", "headers": [(b"authorization", f"Bearer {ADMIN}".encode())]}, receive, recorder.send
    )
    caller = recorder.scopes[0][SCOPE_KEY]
    assert (caller.identity, caller.roles, caller.own_runs_only) == (AUTH_TOKEN_IDENTITY, ROLES, False)


class FakeRequest:
    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope


def test_the_caller_of_a_request() -> None:
    assert caller_of(None) is LOCAL
    assert LOCAL.channel == "stdio" and not LOCAL.verified and LOCAL.roles == ROLES
    assert caller_of(FakeRequest({})) is UNAUTHENTICATED_HTTP
    bob = Caller("bob", frozenset({"read"}), False, "http", True)
    assert caller_of(FakeRequest({SCOPE_KEY: bob})) is bob


def test_forbidden_names_the_role_and_the_identity() -> None:
    bob = Caller("bob", frozenset({"read", "approve"}), False, "http", True)
    bob.require("read", "run_status")
    with pytest.raises(Forbidden) as raised:
        bob.require("operate", "orchestrate_start")
    assert raised.value.code == "forbidden"
    assert "orchestrate_start needs the role 'operate'" in raised.value.message
    assert "'bob' has approve, read" in raised.value.message


def test_a_starts_retry_window_belongs_to_a_person_never_to_a_connection() -> None:
    """What a retried orchestrate_start is matched by (server.identity.start_identity): the token's
    identity, else the local OS user (read from the password database), else one anonymous HTTP
    caller."""
    assert local_user() == pwd.getpwuid(os.getuid()).pw_name
    assert start_identity(LOCAL) == f"stdio:{local_user()}"
    assert start_identity(UNAUTHENTICATED_HTTP) == "http:anonymous"
    alice = caller_for(NamedToken("alice", ALICE, own_runs_only=True))
    assert start_identity(alice) == "token:alice"
    assert start_identity(caller_for(NamedToken("bob", BOB))) == "token:bob"
