"""Every JSON-RPC error this server answers carries a project code: the SDK's own words for a client's
mistake (and an exception escaping a handler) become a message that starts with the stable code and
says what to do, the code also in ``data.code`` (:class:`CodedErrors`); only a server bug logs a
traceback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND
from pydantic import ValidationError

from orchestration.errors import (
    ConstructError,
    InternalError,
    InvalidArgument,
    InvalidRequest,
    InvalidState,
    quoted,
)
from server.mcp.tool_hints import tool_error_text

log = logging.getLogger("construct.server")

#: A message that starts with a project code already.
_CODED = re.compile(r"^[a-z_]+: ")
#: The start of the SDK's answer for a URI no resource or template matches.
_UNKNOWN_RESOURCE = "Unknown resource"


def coded(exc: ConstructError, code: int = INVALID_PARAMS, **data: Any) -> MCPError:
    """``exc`` as a JSON-RPC error: the message starts with its code, which ``data.code`` repeats."""
    return MCPError(code=code, message=tool_error_text(exc), data={"code": exc.code, **data})


class CodedErrors:
    """Server middleware (the outermost): the SDK's own errors, coded.

    * params that do not fit the method (the SDK: ``Invalid request parameters``, with no hint
      which): ``-32602`` ``invalid_argument``, naming the param;
    * a URI no resource template matches: ``-32602`` ``invalid_argument`` (as a malformed run id);
    * a method this server does not serve: ``-32601`` ``invalid_request``;
    * a request before the handshake: ``-32602`` ``invalid_state``;
    * an exception escaping a handler (a bug; the SDK: code ``0``, the exception's text):
      ``-32603`` ``internal_error``, its traceback logged once.

    Errors that already start with a code (``run_not_found: ...``) get it in ``data.code`` too;
    those whose text a specification fixes (MCP Tasks' ``Failed to retrieve task``) pass unchanged.
    A message that is no JSON-RPC request at all never reaches a handler: the transports answer it
    (:mod:`server.transports.invalid_messages`)."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        except ValidationError as exc:
            raise coded(InvalidArgument(_params_error(ctx.method, exc))) from None
        except MCPError as exc:
            raise _recoded(ctx, exc) from None
        except Exception:
            log.exception("%s failed", ctx.method, extra={"action": "request_failed"})
            said = f"{ctx.method} failed on the server; its log says why (action=request_failed)"
            raise coded(InternalError(said), INTERNAL_ERROR) from None


def _recoded(ctx: ServerRequestContext[Any, Any], exc: MCPError) -> MCPError:
    error = exc.error
    coded_as = _CODED.match(error.message)
    if coded_as is not None:  # coded already: the code goes into data too, if it has room
        data = error.data
        if data is None or (isinstance(data, Mapping) and "code" not in data):
            code = coded_as.group(0).removesuffix(": ")
            return MCPError(code=error.code, message=error.message, data={"code": code, **(data or {})})
        return exc
    if error.code == METHOD_NOT_FOUND:
        said = f"this server has no method {quoted(ctx.method)}; see the MCP specification's methods"
        return coded(InvalidRequest(said), METHOD_NOT_FOUND, method=ctx.method[:100])
    data = error.data if isinstance(error.data, Mapping) else {}
    if error.code == INVALID_PARAMS and error.message.startswith(_UNKNOWN_RESOURCE) and "uri" in data:
        uri = str(data["uri"])
        said = (
            f"no resource has the URI {quoted(uri)}: run resources are run://<run_id>, "
            "run://<run_id>/events, run://<run_id>/export and run://<run_id>/tasks/<task_id>/output "
            "(resources/templates/list)"
        )
        return coded(InvalidArgument(said), uri=uri[:200])
    if error.code == INVALID_PARAMS and error.message == "Invalid request parameters":
        # The SDK's answer (as an error, not a ValidationError) to a request before the handshake.
        said = f"the session is not initialized: send initialize first, then {quoted(ctx.method)}"
        return coded(InvalidState(said))
    return exc


def _params_error(method: str, exc: ValidationError) -> str:
    """Which param of ``method`` is wrong, in plain words (no input value echoed)."""
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return f"the params of {quoted(method)} do not fit its schema"
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "params"
    message = str(first["msg"])
    return f"{method}: {where}: {message[:1].lower()}{message[1:200]}"
