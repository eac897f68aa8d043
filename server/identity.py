"""Who is calling, and what they may do: identities, roles and channels.

Over HTTP each bearer token is an identity with roles (``read``, ``operate``, ``approve``), perhaps
limited to the runs it started; a call outside them is ``forbidden``, naming the role, never the
token. stdio, an in-process client and the CLI are local, trusted channels: every role, every run,
and the names they give are recorded as claimed, not verified. No identity may be called ``agent``.
The rules as users see them: docs/approvals.md (Who may do what).
"""

from __future__ import annotations

import functools
import getpass
import os
import pwd
import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from orchestration.core import DecisionChannel, RunHead
from orchestration.errors import Forbidden

Role = Literal["read", "operate", "approve"]
ROLES: frozenset[Role] = frozenset(get_args(Role))
#: The identity the single ``CONSTRUCT_AUTH_TOKEN`` (``auth_token``) stands for.
AUTH_TOKEN_IDENTITY = "admin"
#: What an identity's name may look like: it is shown in views and recorded with decisions.
IDENTITY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")
#: Where the bearer-token middleware leaves the verified caller in the ASGI scope, before the MCP
#: app sees the request; a handler reads it from the HTTP request the SDK hands it
#: (``ctx.request_context.request``). A request with no HTTP request behind it is local.
SCOPE_KEY = "construct.caller"


@dataclass(frozen=True, slots=True)
class NamedToken:
    """One configured token and the identity it stands for. The token is a secret: it is left out
    of ``repr``, and the bearer-token middleware keeps only its digest."""

    identity: str
    token: str
    roles: frozenset[Role] = ROLES
    own_runs_only: bool = False

    def __repr__(self) -> str:
        return f"NamedToken(identity={self.identity!r}, roles={sorted(self.roles)}, own={self.own_runs_only})"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a request: a verified identity (HTTP with a token), or a local caller."""

    #: the verified identity, or None when the channel has no identities (stdio, CLI, HTTP
    #: without tokens)
    identity: str | None
    roles: frozenset[Role]
    own_runs_only: bool
    channel: DecisionChannel
    #: True when ``identity`` comes from a token the server checked
    verified: bool

    @property
    def recorded(self) -> str | None:
        """Who a fact records as having asked for what this caller does: the verified identity,
        else None (a local or unauthenticated caller names nobody it could be held to)."""
        return self.identity if self.verified else None

    def require(self, role: Role, action: str) -> None:
        """Raise ``forbidden`` unless this caller has ``role`` (``action`` names what was asked)."""
        if role in self.roles:
            return
        has = ", ".join(sorted(self.roles)) or "no role"
        raise Forbidden(
            f"{action} needs the role '{role}'; identity {self.identity!r} has {has}. Ask the server's "
            f"operator for a token whose identity has the '{role}' role"
        )

    def may_see(self, head: RunHead) -> bool:
        return not self.own_runs_only or self.started(head)

    def started(self, head: RunHead) -> bool:
        """Whether ``head``'s run was started by this caller's verified identity."""
        return self.verified and head.started_by is not None and head.started_by == self.identity

    def may_read(self, head: RunHead) -> bool:
        """Whether this caller may read ``head``'s run as ``run_status`` does: the ``read`` role,
        and the run is one it may see (``own_runs_only``). Resource update notifications are sent
        on the same rule."""
        return "read" in self.roles and self.may_see(head)

    def sees_content(self, head: RunHead) -> bool:
        """Whether answers to this caller carry ``head``'s content (its request, outputs, previews,
        prompts, gate comments): when it may read the run (:meth:`may_read`), or started it. An
        identity with only ``operate`` or ``approve`` acting on another identity's run gets the
        run's status and what it waits for, the content withheld
        (:func:`server.views.compact.content_for`)."""
        return self.may_read(head) or self.started(head)

    def check_content(self, head: RunHead, action: str) -> None:
        """Raise ``forbidden`` unless this caller :meth:`sees_content` of ``head``."""
        if not self.sees_content(head):
            raise Forbidden(
                f"{action} copies the content of run {head.run_id}, which needs the role 'read' (or to have "
                f"started the run); identity {self.identity!r} has "
                f"{', '.join(sorted(self.roles)) or 'no role'}"
            )

    def check_run(self, head: RunHead) -> None:
        """Raise ``forbidden`` when this caller is limited to its own runs and ``head`` is not one."""
        if not self.may_see(head):
            raise Forbidden(
                f"run {head.run_id} was not started by identity {self.identity!r}, which may only see and "
                "act on the runs it started; use a token whose identity is not limited to its own runs"
            )


#: stdio, an in-process client: every role, nothing verified.
LOCAL = Caller(identity=None, roles=ROLES, own_runs_only=False, channel="stdio", verified=False)
#: HTTP when no token is configured (loopback only): every role, nothing verified.
UNAUTHENTICATED_HTTP = Caller(identity=None, roles=ROLES, own_runs_only=False, channel="http", verified=False)


def caller_for(token: NamedToken) -> Caller:
    return Caller(
        identity=token.identity,
        roles=token.roles,
        own_runs_only=token.own_runs_only,
        channel="http",
        verified=True,
    )


def caller_of(request: Any) -> Caller:
    """The caller behind ``request`` (a handler's ``ctx.request_context.request``): the verified
    caller the middleware left in the ASGI scope, :data:`UNAUTHENTICATED_HTTP` for an HTTP request
    without one (no token is configured), :data:`LOCAL` when there is no HTTP request."""
    if request is None:
        return LOCAL
    scope = getattr(request, "scope", None)
    caller = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
    return caller if isinstance(caller, Caller) else UNAUTHENTICATED_HTTP


@functools.cache
def local_user() -> str:
    """The OS user this process runs as: over stdio, the one who started the server (the host
    spawned it as them). Read from the password database, not from ``USER`` / ``LOGNAME``
    (which the settings alone read, and which a host may not pass on); a uid without an entry
    (a container) is ``uid<N>``."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def cli_user() -> str | None:
    """The name the command line records for whoever runs it (an approver, who handed an output
    in, cancelled or moved a run), claimed: ``getpass``'s (``LOGNAME``, ``USER``, ..., then the
    password database), or None when the system cannot say."""
    try:
        return getpass.getuser()
    except (OSError, KeyError, ImportError):
        return None


def start_identity(caller: Caller) -> str:
    """Whose starts an ``orchestrate_start`` retry window matches (see
    :mod:`orchestration.engine.start_window`): the verified identity of an HTTP token, else the
    channel with the local OS user (``stdio:alice``: stdio and in-process callers are that
    user), else ``http:anonymous`` (HTTP without tokens, loopback only). Never a connection or
    a session: a 2026-07-28 client holds none, and some frameworks open a new connection per
    call, so a retry arrives on another one."""
    if caller.verified and caller.identity is not None:
        return f"token:{caller.identity}"
    if caller.channel == "http":
        return "http:anonymous"
    return f"{caller.channel}:{local_user()}"
