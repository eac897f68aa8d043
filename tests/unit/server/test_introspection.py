"""The checks of an introspected (opaque) token: what the issuer's answer must say for the token to
be taken, how long an answer is kept, and that the token never reaches an error."""

from __future__ import annotations

import functools
import json
from typing import Any

import httpx2
import pytest

from orchestration.workers import introspect
from server.settings.oauth import AuthTable
from server.transports.introspection import Introspection, looks_like_jwt
from server.transports.jwt_adapter import IssuerUnreachable, TokenRefused

ISSUER = "https://idp.example"
AUDIENCE = "https://construct.example/mcp"
TOKEN = "opaque-token-" + "x" * 30
NOW = 1_800_000_000.0


class Keys:
    """The issuer's metadata, as :class:`~server.transports.jwt_adapter.IssuerKeys` gives it."""

    issuer = ISSUER

    def __init__(self, metadata: dict[str, Any]) -> None:
        self._metadata = metadata

    async def metadata(self) -> dict[str, Any]:
        return self._metadata


class Issuer:
    """The introspection endpoint: answers ``answer``, counting the questions."""

    def __init__(self, answer: dict[str, Any], status: int = 200) -> None:
        self.answer, self.status, self.asked = answer, status, 0
        self.forms: list[str] = []

    def transport(self) -> httpx2.MockTransport:
        def handle(request: httpx2.Request) -> httpx2.Response:
            self.asked += 1
            self.forms.append(request.content.decode())
            assert request.headers["authorization"].startswith("Basic ")
            return httpx2.Response(self.status, content=json.dumps(self.answer).encode())

        return httpx2.MockTransport(handle)


def introspection(
    issuer: Issuer, clock: list[float], metadata: dict[str, Any] | None = None
) -> Introspection:
    table = AuthTable(
        issuer=ISSUER,
        audience=AUDIENCE,
        introspection_client_id="construct-server",
        introspection_cache_seconds=30,
    )
    keys = Keys({"introspection_endpoint": f"{ISSUER}/introspect"} if metadata is None else metadata)
    return Introspection(
        table,
        keys,  # type: ignore[arg-type]
        "the-secret",
        clock=lambda: clock[0],
        ask=functools.partial(introspect, transport=issuer.transport()),
    )


def active(**claims: Any) -> dict[str, Any]:
    return {"active": True, "sub": "dana", "aud": AUDIENCE, "iss": ISSUER, "exp": NOW + 600, **claims}


async def test_an_active_token_for_this_server_is_taken_and_kept() -> None:
    clock = [NOW]
    issuer = Issuer(active(scope="construct:read"))
    check = introspection(issuer, clock)
    assert (await check.claims(TOKEN))["sub"] == "dana"
    assert "token_type_hint=access_token" in issuer.forms[0]
    clock[0] += 29
    await check.claims(TOKEN)
    assert issuer.asked == 1, "kept for introspection_cache_seconds"
    clock[0] += 2
    await check.claims(TOKEN)
    assert issuer.asked == 2, "asked again once the kept answer expired"


async def test_a_kept_answer_never_outlives_the_token() -> None:
    clock = [NOW]
    issuer = Issuer(active(exp=NOW + 5))
    check = introspection(issuer, clock)
    await check.claims(TOKEN)
    clock[0] += 6
    issuer.answer = {"active": False}
    with pytest.raises(TokenRefused, match="not active"):
        await check.claims(TOKEN)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"active": False}, "not active"),
        ({"sub": "dana"}, "not active"),
        (active(aud="https://other.example/mcp"), "not issued for this server"),
        (active(aud=None), "not issued for this server"),
        (
            active(aud=["https://other.example", AUDIENCE])["aud"] and active(iss="https://evil.example"),
            "issuer",
        ),
        (active(exp=None), "no expiry"),
        (active(exp=NOW - 60), "expired"),
        (active(nbf=NOW + 120), "not valid yet"),
    ],
)
async def test_refusals(answer: dict[str, Any], reason: str) -> None:
    with pytest.raises(TokenRefused, match=reason) as refused:
        await introspection(Issuer(answer), [NOW]).claims(TOKEN)
    assert TOKEN not in str(refused.value.reason)


async def test_an_audience_list_naming_this_server_is_taken() -> None:
    answer = active(aud=["https://other.example", AUDIENCE])
    assert (await introspection(Issuer(answer), [NOW]).claims(TOKEN))["sub"] == "dana"


async def test_an_issuer_that_cannot_be_asked_is_unreachable_and_no_endpoint_is_refused() -> None:
    with pytest.raises(IssuerUnreachable) as unreachable:
        await introspection(Issuer({"error": "invalid_client"}, status=401), [NOW]).claims(TOKEN)
    assert "invalid_client" in str(unreachable.value) and TOKEN not in str(unreachable.value)
    with pytest.raises(TokenRefused, match="no introspection_endpoint"):
        await introspection(Issuer(active()), [NOW], metadata={}).claims(TOKEN)


def test_only_three_dot_separated_parts_look_like_a_jwt() -> None:
    assert looks_like_jwt("a.b.c") and not looks_like_jwt(TOKEN) and not looks_like_jwt("a.b.c.d.e")
