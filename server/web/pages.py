"""The run pages for a person with a browser: ``/runs`` (the list) and ``/runs/{run_id}`` (one run),
served next to ``/mcp`` by ``construct-mcp serve --transport streamable-http``.

The pages are the run panel of :mod:`server.web.panel` (``data-mode="web"``); they hold no data
themselves (so they need no token) and read small JSON endpoints of this server with ``fetch``:

=================================================== ==========================================
``GET /runs/api/session``                           who the token is: ``identity``, ``roles``,
                                                    ``auth_required``
``GET /runs/api/runs?cursor=&limit=``               a :class:`~server.views.listing.RunsPage`, newest first
``GET /runs/api/runs/{run_id}?task_id=``            a :class:`~server.views.run_view.RunView` (``task_id``:
                                                    that task's output whole)
``GET /runs/api/runs/{run_id}/events?after_seq=``   a :class:`~server.views.events.EventsPage` (``run_events``
``&output_after=``                                  without a wait): the page shows a running task's
                                                    ``output_delta`` text growing
``POST /runs/api/runs/{run_id}/gates/{gate_id}``    decide a gate: ``{"decision": "approve" |
                                                    "reject" | "revise", "comment": "..."}``; the
                                                    run view (its content withheld from an
                                                    identity that may not read the run)
=================================================== ==========================================

**Who may do what.** When the server has tokens (``auth_token`` or ``[tokens.*]``, or an ``[auth]``
issuer whose access tokens it accepts), every
``/runs/api/`` request needs ``Authorization: Bearer <token>`` (checked by the same
:class:`~server.transports.auth.BearerTokenMiddleware` as ``/mcp``, before any of the request's body
is read; the body bound applies after), and the token's identity needs the
same roles
as the tools (:mod:`server.identity`): ``read`` to see runs, ``approve`` to decide gates; one limited
to its own runs sees and decides only those. The page asks for the token in a login form and keeps
it in the tab's ``sessionStorage`` — never a cookie — so a page of another site cannot make the
browser send it: a state change cannot be forged cross-site. (A sign-in through the issuer, below,
does use a cookie: HttpOnly and SameSite=Lax, and a state change with it also needs this server's
``Origin``.) A decision also needs
``Content-Type: application/json``, which a cross-site form cannot send. Without tokens
(loopback only, see :mod:`server.transports.auth`) the page works without login, and, as for
``/mcp``, requests must name
a loopback ``Host`` (and ``Origin``, when sent), so a DNS-rebinding site cannot reach them.

**Signing in through the issuer.** With ``[auth] page_client_id`` set, a page opened without a
session sends the browser to the ``[auth]`` issuer (authorization code with PKCE), and the
endpoints take the session cookie that the sign-in sets as well as a bearer token
(:mod:`server.web.sign_in`); ``POST /runs/sign-out`` ends the session. The pages themselves are
unchanged: the same static page, the same policy.

A decision made here is recorded with channel ``web``: the token's identity, verified; without
tokens, no approver (nothing can be verified, and the page asks for no name).

Ids in paths are checked before use (``invalid_argument``); errors are JSON
``{"error": <code>, "message": <what to do>}`` with an HTTP status matching the code. Every answer
carries ``Cache-Control: no-store``; the pages carry the panel's Content-Security-Policy (with
``frame-ancestors 'none'``), ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from mcp.server.transport_security import TransportSecurityMiddleware
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestration.core import RunHead, RunStatus, validate_run_id
from orchestration.errors import ConstructError, InvalidArgument, quoted
from server.identity import SCOPE_KEY, UNAUTHENTICATED_HTTP, Caller, NamedToken
from server.mcp.services import Services
from server.transports.auth import BearerTokenMiddleware, TokenAuthority
from server.transports.http import BodyLimitMiddleware, security_settings
from server.views.attendance import attended
from server.views.events import MAX_EVENTS_LIMIT, read_events
from server.views.listing import runs_page
from server.views.run_view import check_task_id
from server.web.panel import content_security_policy, page
from server.web.sign_in import SIGN_IN_PATH, SIGN_OUT_PATH, PageSignIn, SessionOrBearer, return_path

log = logging.getLogger("construct.web")

#: The path under which the pages and their endpoints live.
PREFIX = "/runs"
#: The decisions the page may send (it shows only those a gate's view offers: ``decisions``).
DECISIONS = ("approve", "reject", "revise")
#: Ids in a path are at most this long (the runtime checks its own, smaller, limits next).
MAX_PATH_ID_CHARS = 200
#: What an HTTP status each error code is answered with (others: 400).
STATUS_OF = {
    "unauthorized": 401,
    "forbidden": 403,
    "run_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "invalid_state": 409,
    "version_conflict": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "store_error": 503,
    "store_unavailable": 503,
    "unavailable": 503,
    "corrupt_record": 500,
    "record_too_new": 500,
}

_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class WebError(Exception):
    """An error of the web endpoints themselves (not the runtime's): a code and a sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _error(code: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": code, "message": message}, status_code=STATUS_OF.get(code, 400), headers=_SECURITY_HEADERS
    )


def _json(model: BaseModel | dict[str, Any]) -> Response:
    body = model.model_dump_json() if isinstance(model, BaseModel) else json.dumps(model)
    return Response(body, media_type="application/json", headers=_SECURITY_HEADERS)


def _html() -> HTMLResponse:
    return HTMLResponse(
        page("web"),
        headers={
            **_SECURITY_HEADERS,
            "Content-Security-Policy": content_security_policy() + "; frame-ancestors 'none'",
            "X-Frame-Options": "DENY",
        },
    )


def _caller(request: Request) -> Caller:
    """The caller, as over ``/mcp``, but deciding through channel ``web``."""
    found = request.scope.get(SCOPE_KEY)
    caller = found if isinstance(found, Caller) else UNAUTHENTICATED_HTTP
    return dataclasses.replace(caller, channel="web")


def _path_id(request: Request, name: str) -> str:
    value = str(request.path_params[name])
    if not value or len(value) > MAX_PATH_ID_CHARS or not value.isprintable():
        raise InvalidArgument(f"{name} {quoted(value)} is not a valid id; take it from the run view")
    return value


class RunPages:
    """The Starlette app of the pages and endpoints. ``services`` gives the running server's
    :class:`~server.mcp.services.Services` (None before its lifespan started or after it ended);
    ``tokens`` are the configured tokens (empty: none needed); ``host`` is the bound host (a
    loopback one switches on the ``Host``/``Origin`` checks); ``max_body_bytes`` bounds a body
    sent to the endpoints.

    The layers of ``/runs/api/`` are token first, body bound second: a request without a valid
    token is answered ``401`` before a byte of its body is read (so an anonymous client cannot make
    the server hold bodies up to the bound, as ``/mcp`` cannot), and only an identified request's
    body is read, held up to the bound (:class:`~server.transports.http.BodyLimitMiddleware`). The
    pages themselves answer GET only and never read a body, so they need no bound."""

    def __init__(
        self,
        services: Callable[[], Services | None],
        tokens: Sequence[NamedToken],
        host: str,
        max_body_bytes: int,
        authority: TokenAuthority | None = None,
        sign_in: PageSignIn | None = None,
    ) -> None:
        self._services = services
        self._sign_in = sign_in
        self.auth_required = bool(tokens) or authority is not None
        self._security = TransportSecurityMiddleware(security_settings(host))
        api: ASGIApp = Starlette(
            routes=[
                Route("/session", self.session, methods=["GET"]),
                Route("/runs", self.list_runs, methods=["GET"]),
                Route("/runs/{run_id}", self.run, methods=["GET"]),
                Route("/runs/{run_id}/events", self.events, methods=["GET"]),
                Route("/runs/{run_id}/gates/{gate_id}", self.decide, methods=["POST"]),
                Route("/{rest:path}", _not_found),
            ],
            exception_handlers={405: _not_allowed},
        )
        api = BodyLimitMiddleware(api, max_body_bytes)
        if sign_in is not None:
            api = SessionOrBearer(api, BearerTokenMiddleware(api, tokens, authority), sign_in)
        elif self.auth_required:
            api = BearerTokenMiddleware(api, tokens, authority)
        signing = (
            []
            if sign_in is None
            else [
                Route(SIGN_IN_PATH, self.sign_in_page, methods=["GET"]),
                Route(SIGN_OUT_PATH, sign_in.sign_out, methods=["POST"]),
                Route(sign_in.redirect_path, sign_in.callback, methods=["GET"]),
            ]
        )
        self.app = Starlette(
            routes=[
                *signing,
                Route(PREFIX, self.list_page, methods=["GET"]),
                Mount(PREFIX + "/api", app=api),
                Route(PREFIX + "/{run_id}", self.run_page, methods=["GET"]),
                Route(PREFIX + "/{rest:path}", _not_found),
            ],
            exception_handlers={405: _not_allowed},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope, receive)
            refused = await self._security.validate_request(request, is_post=request.method == "POST")
            if refused is not None:
                code = "unsupported_media_type" if refused.status_code == 400 else "forbidden"
                message = (
                    "send the decision as JSON (Content-Type: application/json)"
                    if code == "unsupported_media_type"
                    else "this server answers loopback Host and Origin names only; open the page at "
                    "http://127.0.0.1:<port>/runs"
                )
                await _error(code, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    # -- pages ---------------------------------------------------------------------------------

    async def list_page(self, request: Request) -> Response:
        return await self._signed_in_html(request)

    async def run_page(self, request: Request) -> Response:
        try:
            validate_run_id(_path_id(request, "run_id"))
        except ConstructError as exc:
            return _error(exc.code, exc.message)
        return await self._signed_in_html(request)

    async def sign_in_page(self, request: Request) -> Response:
        """Start a sign-in, to come back to ``?return=`` (a run page) or ``/runs``."""
        assert self._sign_in is not None, "routed only with a sign-in"
        return await self._sign_in.start(request, return_path(request.query_params.get("return", "")))

    async def _signed_in_html(self, request: Request) -> Response:
        """The page; with sign-in through the issuer, only for a live session (else the sign-in)."""
        if self._sign_in is not None and self._sign_in.caller(request) is None:
            return await self._sign_in.start(request, return_path(request.url.path))
        return _html()

    # -- endpoints -----------------------------------------------------------------------------

    def _running(self) -> Services:
        services = self._services()
        if services is None:
            raise WebError("unavailable", "the server is starting or stopping; try again in a moment")
        return services

    async def session(self, request: Request) -> Response:
        caller = _caller(request)
        return _json(
            {
                "auth_required": self.auth_required,
                "identity": caller.identity,
                "roles": sorted(caller.roles),
                "own_runs_only": caller.own_runs_only,
            }
        )

    async def list_runs(self, request: Request) -> Response:
        async def work() -> BaseModel:
            caller = _caller(request)
            caller.require("read", "listing runs")
            query = request.query_params
            limit_text = query.get("limit", "20")
            if not limit_text.isdigit():
                raise InvalidArgument(f"limit {quoted(limit_text)} is not a number from 1 to 500")
            known = {status.value for status in RunStatus}
            asked = query.getlist("status")
            for status in asked:
                if status not in known:
                    raise InvalidArgument(f"status {quoted(status)} is not one of {', '.join(sorted(known))}")
            statuses = frozenset(RunStatus(status) for status in asked)
            page_ = await self._running().runtime.list_runs(
                statuses or None, int(limit_text), query.get("cursor") or None
            )
            runtime = self._running().runtime
            heads = [h for h in page_.runs if caller.may_see(h)] if caller.own_runs_only else page_.runs
            listed = runs_page(heads, page_.next_cursor)
            now = runtime.clock.now()
            runs = [
                await attended(run, head, runtime.store, now)
                for run, head in zip(listed.runs, heads, strict=True)
            ]
            return listed.model_copy(update={"runs": runs})

        return await _answer(work)

    async def _readable(self, request: Request, what: str) -> tuple[Caller, Services, RunHead]:
        """The caller, the services and the path's run, once it is checked the caller may read it."""
        caller = _caller(request)
        caller.require("read", what)
        services = self._running()
        head = await services.runtime.status(_path_id(request, "run_id"))
        caller.check_run(head)
        return caller, services, head

    async def run(self, request: Request) -> Response:
        async def work() -> BaseModel:
            caller, services, head = await self._readable(request, "reading a run")
            task_id = request.query_params.get("task_id") or None
            if task_id is not None:
                check_task_id(head, task_id)
            view = await services.view(head.run_id, head, "compact", task_id, caller=caller)
            # Whether anyone drives it: read at each request (a view is kept per version, and a
            # driver's death changes no version).
            return await attended(view, head, services.runtime.store, services.runtime.clock.now())

        return await _answer(work)

    async def events(self, request: Request) -> Response:
        async def work() -> BaseModel:
            _, services, head = await self._readable(request, "reading a run's events")
            after_seq, output_after = (_count(request, name) for name in ("after_seq", "output_after"))
            return await read_events(
                services.runtime, head.run_id, after_seq, MAX_EVENTS_LIMIT, 0.0, head, output_after
            )

        return await _answer(work)

    async def decide(self, request: Request) -> Response:
        async def work() -> BaseModel:
            caller = _caller(request)
            caller.require("approve", "deciding a gate")
            run_id, gate_id = _path_id(request, "run_id"), _path_id(request, "gate_id")
            decision, comment = _decision(await request.body())
            services = self._running()
            caller.check_run(await services.runtime.status(run_id))
            head = await services.runtime.approve(
                run_id,
                decision,  # type: ignore[arg-type]  # checked against DECISIONS by _decision
                gate_id,
                comment,
                caller.identity if caller.verified else None,
                channel="web",
                verified=caller.verified,
            )
            services.dispatcher.wake(run_id)
            log.info(
                "gate decided on the web page",
                extra={"action": "web_decision", "run_id": run_id, "gate_id": gate_id, "decision": decision},
            )
            return await services.view(head.run_id, head, caller=caller)

        return await _answer(work)


def _count(request: Request, name: str) -> int:
    """A non-negative integer query parameter (0 when absent)."""
    text = request.query_params.get(name, "0")
    if not text.isdigit():
        raise InvalidArgument(f"{name} {quoted(text)} is not a number of 0 or more")
    return int(text)


async def _not_found(request: Request) -> Response:
    return _error("not_found", f"nothing at {request.url.path}; the run pages are /runs and /runs/<run_id>")


async def _not_allowed(request: Request, _exc: Exception) -> Response:
    return _error(
        "method_not_allowed",
        f"{request.method} is not answered at {request.url.path}; pages and reads are GET, decisions POST",
    )


def _decision(body: bytes) -> tuple[str, str | None]:
    try:
        data = json.loads(body or b"null")
    except ValueError as exc:
        raise InvalidArgument('the body is not JSON; send {"decision": "approve"}') from exc
    if not isinstance(data, dict) or set(data) - {"decision", "comment"}:
        raise InvalidArgument(
            'send a JSON object {"decision": "approve" | "reject" | "revise", "comment": "..."}'
        )
    decision, comment = data.get("decision"), data.get("comment")
    if decision not in DECISIONS:
        raise InvalidArgument(f"decision must be one of {', '.join(DECISIONS)}, not {quoted(str(decision))}")
    if comment is not None and not isinstance(comment, str):
        raise InvalidArgument("comment must be a string")
    return str(decision), comment or None


async def _answer(work: Callable[[], Any]) -> Response:
    try:
        model = await work()
    except ConstructError as exc:
        log.info("web request refused: %s", exc.code, extra={"action": "web_error", "code": exc.code})
        return _error(exc.code, exc.message)
    except WebError as exc:
        return _error(exc.code, exc.message)
    return _json(model)


def with_run_pages(
    app: ASGIApp,
    services: Callable[[], Services | None],
    tokens: Sequence[NamedToken],
    host: str,
    max_body_bytes: int,
    authority: TokenAuthority | None = None,
    sign_in: PageSignIn | None = None,
) -> ASGIApp:
    """``app`` (``/mcp``, already behind its tokens) with the run pages next to it (their endpoints'
    bodies bounded at ``max_body_bytes``, behind their tokens and the ``[auth]`` issuer's access
    tokens, and its sign-in's session cookies with ``sign_in``: see :class:`RunPages`)."""
    return WithRunPages(app, RunPages(services, tokens, host, max_body_bytes, authority, sign_in))


class WithRunPages:
    """Sends ``/runs`` and everything under it to the pages (which guard their endpoints
    themselves), everything else to ``app`` (``/mcp`` behind its tokens)."""

    def __init__(self, app: ASGIApp, pages: ASGIApp) -> None:
        self._app = app
        self._pages = pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == PREFIX or path.startswith(PREFIX + "/")):
            await self._pages(scope, receive, send)
            return
        await self._app(scope, receive, send)
