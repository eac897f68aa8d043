"""The run pages sign a person in through the ``[auth]`` issuer: authorization code with PKCE (a
public client, or a confidential one with its secret), then a short server-side session held by a
cookie. On when ``[auth] page_client_id`` is set (:mod:`server.settings.oauth`).

The flow, all of it on this server's paths under ``/runs``:

1. ``GET /runs`` (or ``/runs/<run_id>``, or ``/runs/sign-in``) without a session: ``303`` to the
   issuer's ``authorization_endpoint`` (from its metadata, :meth:`IssuerKeys.metadata
   <server.transports.jwt_adapter.IssuerKeys.metadata>`) with ``state``, ``nonce``, the S256
   ``code_challenge`` and the resource indicator (the audience). The verifier, the nonce and the page
   to come back to are kept here, in memory, under the state, for :data:`PENDING_SECONDS`; the browser
   gets a random *binding* cookie (HttpOnly, SameSite=Lax) whose digest the pending sign-in holds, so
   that a code delivered to another browser (login CSRF) is refused.
2. ``GET <page_redirect_path>?code=&state=``: the state is taken (once), the binding checked, the code
   exchanged at the ``token_endpoint`` (:func:`orchestration.workers.exchange_code`) with the
   verifier, and the access token verified exactly as ``/mcp`` verifies one
   (:meth:`OAuthResource.identify <server.transports.resource_server.OAuthResource.identify>`:
   issuer, audience, signature, expiry, roles). An ID token in the answer is verified too (for
   the page's client) and must carry the nonce.
3. The session: an opaque random id in a cookie (``HttpOnly``, ``SameSite=Lax``, ``Path=/``,
   ``Secure`` and the ``__Host-`` prefix when the server's origin is https), mapped here to the
   verified caller and an expiry — ``page_session_seconds`` at most, never past the access token's
   ``exp``. Only the id's SHA-256 is kept, so nothing here can be replayed as a cookie.
4. ``POST /runs/sign-out`` (JSON, from this server's origin) forgets the session: the same cookie,
   replayed, is then refused like no cookie at all (``401`` on the API, the sign-in redirect on a
   page), and nothing of a run is shown or recorded.

Why ``SameSite=Lax`` and not ``Strict``: the callback is a top-level navigation *from the issuer's
site*, and its redirect to the page is part of that cross-site chain; a Strict cookie would not be
sent there, so the page would send the person back to the issuer at once. Lax still withholds the
cookie from every cross-site POST and every cross-site subresource request, and each state change
(a decision, sign-out) also needs ``Content-Type: application/json`` (which a cross-site form cannot
send) and an ``Origin`` equal to this server's.

Sessions live in this process's memory, bounded (:data:`MAX_SESSIONS`, :data:`MAX_PENDING`): a
restart signs everyone out, and behind a load balancer the pages need sticky sessions. The
client secret, the code, the verifier and the tokens are never logged nor put in an answer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestration.workers import TokenEndpointError, exchange_code
from server.identity import SCOPE_KEY, Caller
from server.transports.auth import InsufficientScope, is_loopback, send_json
from server.transports.jwt_adapter import IssuerUnreachable, JwtVerifier, TokenRefused
from server.transports.resource_server import OAuthResource

log = logging.getLogger("construct.web")

#: How long a started sign-in may take, from the redirect to the issuer to the callback.
PENDING_SECONDS = 600
#: Started sign-ins kept at most (the oldest is dropped to make room).
MAX_PENDING = 1000
#: Sessions kept at most (the expired, then the oldest, make room).
MAX_SESSIONS = 10_000
#: The path that starts a sign-in, and the one that ends a session.
SIGN_IN_PATH = "/runs/sign-in"
SIGN_OUT_PATH = "/runs/sign-out"
#: A page a sign-in may come back to: the run pages only.
RETURN_PATH = re.compile(r"^/runs(/[A-Za-z0-9._~%:-]{1,200})?$")
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class PageSessions:
    """Signed-in callers by the SHA-256 of their cookie's id, each with an expiry (epoch seconds)."""

    def __init__(self, clock: Callable[[], float] = time.time, max_sessions: int = MAX_SESSIONS) -> None:
        self._clock = clock
        self._max = max_sessions
        self._by_digest: dict[bytes, tuple[Caller, float]] = {}

    def open(self, caller: Caller, expires_at: float) -> str:
        """A new session for ``caller`` until ``expires_at``; its id, for the cookie."""
        if len(self._by_digest) >= self._max:
            now = self._clock()
            self._by_digest = {d: s for d, s in self._by_digest.items() if s[1] > now}
            while len(self._by_digest) >= self._max:
                del self._by_digest[next(iter(self._by_digest))]
        session_id = secrets.token_urlsafe(32)
        self._by_digest[_digest(session_id)] = (caller, expires_at)
        return session_id

    def find(self, session_id: str) -> Caller | None:
        """The caller of a live session; None for an unknown, expired or closed one."""
        found = self._by_digest.get(_digest(session_id))
        if found is None:
            return None
        caller, expires_at = found
        if self._clock() >= expires_at:
            del self._by_digest[_digest(session_id)]
            return None
        return caller

    def close(self, session_id: str) -> Caller | None:
        """Forget the session; its caller, or None when there was none."""
        found = self._by_digest.pop(_digest(session_id), None)
        return None if found is None else found[0]


@dataclass(frozen=True, slots=True)
class Pending:
    """A started sign-in, under its state."""

    verifier: str
    nonce: str
    binding: bytes
    return_to: str
    started: float


class SignInRefused(Exception):
    """A callback that signs nobody in: ``status``, a safe ``message`` for the person, and a
    ``reason`` for the log."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.message = message
        self.reason = reason


class PageSignIn:
    """The sign-in of the run pages through ``resource``'s issuer (see the module docstring)."""

    def __init__(
        self,
        resource: OAuthResource,
        client_secret: str | None,
        *,
        clock: Callable[[], float] = time.time,
        exchange: Callable[..., Any] = exchange_code,
    ) -> None:
        table = resource.table
        assert table.page_client_id is not None, "an [auth] table with page_client_id"
        self._resource = resource
        self._table = table
        self.client_id = table.page_client_id
        self._secret = client_secret
        self._clock = clock
        self._exchange = exchange
        self.sessions = PageSessions(clock)
        self._pending: dict[str, Pending] = {}
        self.origin = table.origin
        self.redirect_path = table.page_redirect_path
        self.secure = self.origin.startswith("https://")
        prefix = "__Host-" if self.secure else ""
        self.session_cookie = f"{prefix}construct-runs"
        self.binding_cookie = f"{prefix}construct-sign-in"
        # ID tokens are for the page's client; same keys, same checks, another audience.
        keys, leeway = resource.verifier.keys, table.leeway_seconds
        self._id_tokens = JwtVerifier(keys, audience=self.client_id, leeway_seconds=leeway)

    # -- who is signed in ----------------------------------------------------------------------

    def caller(self, request: Request) -> Caller | None:
        """The caller of the request's session cookie, if it names a live session."""
        session_id = request.cookies.get(self.session_cookie)
        return None if not session_id else self.sessions.find(session_id)

    def same_origin(self, request: Request) -> bool:
        """Whether a state-changing request comes from this server's own pages."""
        origin = request.headers.get("origin")
        return origin is not None and hmac.compare_digest(origin.encode(), self.origin.encode())

    # -- step 1: to the issuer -----------------------------------------------------------------

    async def start(self, request: Request, return_to: str) -> Response:
        """``303`` to the issuer's authorization endpoint, the sign-in kept under its state."""
        try:
            endpoint = _endpoint(await self._resource.verifier.keys.metadata(), "authorization_endpoint")
        except IssuerUnreachable as exc:
            log.error("cannot start a sign-in: %s", exc, extra={"action": "page_sign_in_unavailable"})
            return _refusal(503, "The identity provider cannot be reached now; try again shortly.")
        binding = request.cookies.get(self.binding_cookie) or ""
        if not 40 <= len(binding) <= 64:
            binding = secrets.token_urlsafe(32)
        state, verifier, nonce = (secrets.token_urlsafe(32) for _ in range(3))
        now = self._clock()
        # Oldest first (insertion order): the expired go, then the oldest if still full.
        while self._pending and (
            len(self._pending) >= MAX_PENDING
            or now - next(iter(self._pending.values())).started > PENDING_SECONDS
        ):
            del self._pending[next(iter(self._pending))]
        self._pending[state] = Pending(verifier, nonce, _digest(binding), return_to, now)
        query = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self._table.redirect_uri,
            "scope": " ".join(self._table.scopes_asked()),
            "state": state,
            "nonce": nonce,
            "code_challenge": _b64(hashlib.sha256(verifier.encode()).digest()),
            "code_challenge_method": "S256",
            "resource": self._resource.audience,
        }
        joiner = "&" if urlsplit(endpoint).query else "?"
        answer = RedirectResponse(endpoint + joiner + urlencode(query), status_code=303, headers=_HEADERS)
        self._set_cookie(answer, self.binding_cookie, binding, PENDING_SECONDS)
        return answer

    # -- step 2: back from the issuer ----------------------------------------------------------

    async def callback(self, request: Request) -> Response:
        """The issuer's answer: a session and ``303`` to the page, or a refusal (no session)."""
        try:
            caller, expires_at, return_to = await self._signed_in(request)
        except SignInRefused as exc:
            log.warning("refused a sign-in: %s", exc.reason, extra={"action": "page_sign_in_refused"})
            # The binding cookie stays: a forged callback must not spoil a sign-in under way.
            return _refusal(exc.status, exc.message)
        session_id = self.sessions.open(caller, expires_at)
        log.info(
            "signed in on the run pages: %s",
            caller.identity,
            extra={"action": "page_signed_in", "identity": caller.identity},
        )
        answer = RedirectResponse(self.origin + return_to, status_code=303, headers=_HEADERS)
        self._set_cookie(answer, self.binding_cookie, "", 0)
        lifetime = max(1, int(expires_at - self._clock()))
        self._set_cookie(answer, self.session_cookie, session_id, lifetime)
        return answer

    async def _signed_in(self, request: Request) -> tuple[Caller, float, str]:
        query = request.query_params
        state = query.get("state", "")
        pending = self._pending.pop(state, None)
        if pending is None:
            message = "This sign-in is unknown or was used; open /runs again."
            raise SignInRefused(400, message, "unknown state")
        binding = request.cookies.get(self.binding_cookie, "")
        if not hmac.compare_digest(_digest(binding), pending.binding):
            message = "This sign-in was started in another browser."
            raise SignInRefused(400, message, "binding cookie mismatch")
        if self._clock() - pending.started > PENDING_SECONDS:
            raise SignInRefused(400, "This sign-in took too long; open /runs again.", "sign-in expired")
        if "error" in query or not query.get("code"):
            error = query.get("error")
            said = "no error and no code" if error is None else error
            shown = said[:40] if re.fullmatch(r"[A-Za-z0-9_. -]{1,100}", said) else "unreadable"
            message = "The identity provider did not sign you in."
            raise SignInRefused(401, message, f"the issuer sent {shown!r}")
        answer = await self._exchanged(query["code"], pending.verifier)
        caller, expires_at = await self._verified(answer, pending.nonce)
        return caller, expires_at, pending.return_to

    async def _exchanged(self, code: str, verifier: str) -> dict[str, Any]:
        try:
            endpoint = _endpoint(await self._resource.verifier.keys.metadata(), "token_endpoint")
            form = {
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": self._table.redirect_uri,
                "code_verifier": verifier,
                "resource": self._resource.audience,
            }
            answer: dict[str, Any] = await self._exchange(
                endpoint, form, client_id=self.client_id, client_secret=self._secret
            )
        except IssuerUnreachable as exc:
            raise SignInRefused(503, "The identity provider cannot be reached now.", str(exc)) from exc
        except TokenEndpointError as exc:
            raise SignInRefused(401, "The identity provider did not sign you in.", str(exc)) from exc
        return answer

    async def _verified(self, answer: dict[str, Any], nonce: str) -> tuple[Caller, float]:
        try:
            caller, user = await self._resource.identify(str(answer["access_token"]))
            id_token = answer.get("id_token")
            if id_token is not None:
                claims = await self._id_tokens.claims(str(id_token))
                if not hmac.compare_digest(str(claims.get("nonce", "")).encode(), nonce.encode()):
                    raise TokenRefused("the ID token does not carry this sign-in's nonce")
        except TokenRefused as exc:
            raise SignInRefused(401, "The identity provider's token was not accepted.", exc.reason) from exc
        except InsufficientScope as exc:
            message = "You are signed in at the identity provider, but it gives you no role on this server."
            raise SignInRefused(403, message, "the token gives no role") from exc
        except IssuerUnreachable as exc:
            raise SignInRefused(503, "The identity provider cannot be reached now.", str(exc)) from exc
        expires_at = self._clock() + self._table.page_session_seconds
        if user.access_token.expires_at is not None:
            expires_at = min(expires_at, float(user.access_token.expires_at))
        return caller, expires_at

    # -- step 4: sign-out ----------------------------------------------------------------------

    async def sign_out(self, request: Request) -> Response:
        """Forget the request's session (from this server's pages only)."""
        if not self.same_origin(request):
            return JSONResponse(
                {"error": "forbidden", "message": "sign out from this server's own pages"},
                status_code=403,
                headers=_HEADERS,
            )
        session_id = request.cookies.get(self.session_cookie)
        caller = self.sessions.close(session_id) if session_id else None
        if caller is not None:
            log.info(
                "signed out of the run pages: %s",
                caller.identity,
                extra={"action": "page_signed_out", "identity": caller.identity},
            )
        answer = JSONResponse({"signed_out": caller is not None}, headers=_HEADERS)
        self._set_cookie(answer, self.session_cookie, "", 0)
        return answer

    # -- cookies -------------------------------------------------------------------------------

    def _set_cookie(self, answer: Response, name: str, value: str, max_age: int) -> None:
        """HttpOnly, SameSite=Lax, Path=/, no Domain (this host only), Secure on https; ``max_age``
        0 deletes it."""
        answer.set_cookie(
            name, value, max_age=max_age, path="/", secure=self.secure, httponly=True, samesite="lax"
        )


def page_sign_in(resource: OAuthResource | None, client_secret: str | None) -> PageSignIn | None:
    """The run pages' sign-in when ``[auth]`` configures one (``page_client_id``), else None."""
    if resource is None or not resource.table.page_sign_in:
        return None
    return PageSignIn(resource, client_secret)


def return_path(path: str) -> str:
    """Where a sign-in started at ``path`` comes back to: that run page, else ``/runs``."""
    return path if RETURN_PATH.match(path) and path not in (SIGN_IN_PATH, SIGN_OUT_PATH) else "/runs"


def _endpoint(metadata: dict[str, Any], name: str) -> str:
    value = metadata.get(name)
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or not parts.hostname or parts.fragment:
        raise IssuerUnreachable(f"the issuer's metadata has no usable {name}")
    if parts.scheme != "https" and not (parts.scheme == "http" and is_loopback(parts.hostname)):
        raise IssuerUnreachable(f"the issuer's {name} is not https")
    return str(value)


def _refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": "sign_in_failed", "message": message}, status_code=status, headers=_HEADERS)


_NO_STORE = (b"cache-control", b"no-store")


class SessionOrBearer:
    """The run pages' API behind a session cookie or a bearer token. A request with an
    ``Authorization`` header goes to ``bearer`` (the token middleware, as before); one without it
    needs a live session, and, unless it only reads, an ``Origin`` of this server's. Without
    either: ``401`` naming where to sign in, the cookie (if any) deleted, nothing of a run shown."""

    def __init__(self, api: ASGIApp, bearer: ASGIApp, sign_in: PageSignIn) -> None:
        self._api = api
        self._bearer = bearer
        self._sign_in = sign_in

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or any(name.lower() == b"authorization" for name, _ in scope["headers"]):
            await self._bearer(scope, receive, send)
            return
        request = Request(scope)
        caller = self._sign_in.caller(request)
        if caller is None:
            had_cookie = self._sign_in.session_cookie in request.cookies
            if had_cookie:
                log.warning("refused an ended page session", extra={"action": "page_session_refused"})
            cookie = (b"set-cookie", self._expired_cookie()) if had_cookie else _NO_STORE
            payload = {
                "error": "unauthorized",
                "message": f"sign in at {SIGN_IN_PATH} (no session, or it ended)",
                "sign_in": SIGN_IN_PATH,
            }
            await send_json(send, 401, payload, cookie)
            return
        if request.method not in ("GET", "HEAD") and not self._sign_in.same_origin(request):
            payload = {"error": "forbidden", "message": "decide from this server's own pages"}
            await send_json(send, 403, payload)
            return
        scope[SCOPE_KEY] = caller
        await self._api(scope, receive, send)

    def _expired_cookie(self) -> bytes:
        answer = Response()
        answer.delete_cookie(
            self._sign_in.session_cookie, path="/", secure=self._sign_in.secure, httponly=True, samesite="lax"
        )
        return answer.headers["set-cookie"].encode()


__all__ = ["PageSessions", "PageSignIn", "SessionOrBearer", "page_sign_in", "return_path"]
