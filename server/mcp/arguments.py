"""Strict tool arguments: every refusal of a call's arguments (:class:`StrictTool`) or tool name
(:class:`UnknownToolRefusal`) is an ``isError`` result that starts with its stable code and names the
argument in plain words; :func:`strict_schema` publishes what is enforced in a portable form.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import CallToolResult, TextContent
from pydantic import Field, ValidationError

from orchestration.core import Limits
from orchestration.errors import ConstructError, InvalidArgument, TooLarge, did_you_mean, quoted
from server.mcp.tool_hints import tool_error_text
from server.sdk import validated_before, validated_once

log = logging.getLogger("construct.tools")


def error_result(exc: ConstructError) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=tool_error_text(exc))], is_error=True)


#: Given the call's context and raw arguments, the error for a required argument the caller left out
#: (naming the value to pass); see ``missing`` in :func:`server.mcp.publishing.build_tools`.
MissingHint = Callable[[Context[Any, Any], Mapping[str, Any]], Awaitable[ConstructError]]


#: Arguments a host application adds to every tool's input schema on its own and sends in its
#: calls; they mean nothing to this server, so they are dropped before the arguments are checked
#: (never refused as unknown, never reaching a tool or a run's record). The published schemas do
#: not list them. Gemini CLI adds ``wait_for_previous`` (a boolean its model sets to say whether the
#: call must wait for the calls before it in the same turn: the host's own scheduling).
HOST_ADDED_ARGUMENTS = frozenset({"wait_for_previous"})

#: Free-text arguments: whatever the caller sends is the text, even when it looks like JSON.
_TEXT_ARGUMENTS = frozenset({"request", "output", "comment", "reason"})


class _VerbatimText(FuncMetadata):
    """The SDK turns a string argument that parses as JSON into that value unless the parameter
    is annotated exactly ``str`` (for hosts that send lists as JSON text); ``output: str | None``
    then refused a typed step's answer, which *is* a JSON object. Free-text arguments keep the
    string the caller sent (recorded verbatim); the others are pre-parsed only into a JSON object
    or array (``chain`` may still arrive as a JSON list in a string), never into a boolean or
    null (``"true"`` is no boolean). A null argument is left out, so it means what omitting it
    means.

    Validation is strict: the types the input schema publishes, no
    coercion, as a JSON Schema validator would judge them (``"1"`` is no number, ``true`` no
    number, ``"yes"`` no boolean); an integral number (``20.0``) is an integer, as JSON Schema
    says and as Gemini sends integers."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        parsed = super().pre_parse_json(data)
        # An argument sent as null is an argument not given (a strict model sends every key; see
        # strict_schema): its default applies, a required one is missing.
        return {
            k: v if k not in _TEXT_ARGUMENTS and _pre_parsed_as_json(data[k], v) else data[k]
            for k, v in parsed.items()
            if data[k] is not None
        }

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        checked = validated_before(arguments_to_validate)  # by StrictTool.run
        if checked is not None:
            return checked
        parsed = self.pre_parse_json(arguments_to_validate)
        # Strict in JSON mode: an enum member or a nested model from its JSON form, nothing coerced.
        text = json.dumps(_integral_as_int(parsed), allow_nan=True)
        return self.arg_model.model_validate_json(text, strict=True).model_dump_one_level()


def _pre_parsed_as_json(sent: Any, parsed: Any) -> bool:
    """Whether the SDK's JSON pre-parse of an argument is kept: a string holding a JSON object or
    array (a host's way of sending one); not a string become a boolean or null."""
    return sent is parsed or isinstance(parsed, dict | list)


def _integral_as_int(value: Any) -> Any:
    """``value`` with every integral float (``20.0``) as the integer it is: one JSON number, which
    JSON Schema's ``integer`` takes (and ``number`` does too)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_as_int(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_as_int(v) for v in value]
    return value


def verbatim_text(meta: FuncMetadata) -> FuncMetadata:
    """``meta`` with free-text arguments kept as sent (see :class:`_VerbatimText`), publishing the
    same output schema, portable (:func:`portable_schema`). Without its output model: the SDK
    would otherwise validate each answer's structured content against it again, rebuilding the
    whole model from the dict, and every answer of these tools is already the JSON dump of a
    model of that very type (:func:`server.mcp.answering.answer`)."""
    return _VerbatimText(
        arg_model=meta.arg_model,
        output_schema=None if meta.output_schema is None else portable_schema(meta.output_schema),
        output_model=None,
        wrap_output=meta.wrap_output,
    )


class StrictTool(Tool):
    """A tool whose arguments are checked before the SDK validates them, so that every refusal is
    an ``isError`` result starting with its stable code (the SDK's own would be its raw
    validation text after ``Error executing tool <name>:``):

    * an argument the tool does not take is ``invalid_argument: unknown argument 'x'`` with the
      closest known name (an ignored ``approve_befor`` would silently drop a gate), but for the
      arguments hosts add to every tool (:data:`HOST_ADDED_ARGUMENTS`), which are dropped;
    * a schema violation is ``invalid_argument: <argument>: <what is wrong>``, or ``too_large``
      for a string or list over its bound; nothing of the rejected value is echoed;
    * a missing argument with a hint in :attr:`missing` gets the hint's error, which names the
      value to pass (looked up in the run).
    """

    missing: dict[str, MissingHint] = Field(default_factory=dict, exclude=True)

    async def run(
        self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False
    ) -> Any:
        arguments = self._without_host_added(arguments)
        outcome = await self._refusal(arguments, context)
        if isinstance(outcome, ConstructError):
            log.info(
                "%s refused its arguments: %s",
                self.name,
                outcome.code,
                extra={"action": "tool_error", "code": outcome.code},
            )
            return error_result(outcome)
        with validated_once(arguments, outcome):  # the SDK's validation reuses it (_VerbatimText)
            return await super().run(arguments, context, convert_result)

    def _without_host_added(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``arguments`` without those a host added on its own (:data:`HOST_ADDED_ARGUMENTS`) that
        this tool does not take; the same dict when there are none."""
        dropped = HOST_ADDED_ARGUMENTS.intersection(arguments).difference(
            self.fn_metadata.arg_model.model_fields
        )
        if not dropped:
            return arguments
        return {name: value for name, value in arguments.items() if name not in dropped}

    async def _refusal(
        self, arguments: dict[str, Any], context: Context[Any, Any]
    ) -> ConstructError | dict[str, Any]:
        """The error for the call's arguments, or, when they are right, what validating them gave."""
        known = list(self.fn_metadata.arg_model.model_fields)
        unknown = [name for name in arguments if name not in known]
        if unknown:
            said = [_unknown_argument(name, self.name, known) for name in unknown[:5]]
            return InvalidArgument("; ".join(said))
        try:
            return self.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            for err in errors:
                hint = self.missing.get(str(err["loc"][0])) if err["type"] == "missing" else None
                if hint is not None and isinstance(arguments.get("run_id"), str):
                    try:
                        return await hint(context, arguments)
                    except ConstructError as lookup_failed:
                        return lookup_failed
            return _schema_error(errors)


class UnknownToolRefusal:
    """Server middleware: a ``tools/call`` naming a tool this server does not have is refused like
    any other mistake, ``invalid_argument: unknown tool 'x' (did you mean ...)``, instead of the
    SDK's ``Unknown tool: <the whole name, however long>``."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.names = [tool.name for tool in tools]

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params
        if ctx.method == "tools/call" and params is not None:
            name = params.get("name")
            if isinstance(name, str) and name not in self.names:
                hint = close_or_all(name, self.names, "the tools are")
                log.info("unknown tool refused", extra={"action": "tool_error", "code": "invalid_argument"})
                return error_result(InvalidArgument(f"unknown tool {quoted(name)}{hint}"))
        return await call_next(ctx)


def close_or_all(name: str, known: Sequence[str], listing: str) -> str:
    """What to say after an unknown ``name``: the closest of ``known``, else all of them."""
    return did_you_mean(name, known) or f"; {listing}: {', '.join(known)}"


def _unknown_argument(name: str, tool: str, known: list[str]) -> str:
    return f"unknown argument {quoted(name)}{close_or_all(name, known, f'{tool} takes')}"


def _schema_error(errors: list[Any]) -> ConstructError:
    """One error for a failed argument validation: the first argument at fault, in plain words.
    pydantic reports each member of a union (``chain``: a name or a list) as its own error; they
    are said together."""
    first = errors[0]["loc"][0]
    mine = [e for e in errors if e["loc"][0] == first]
    for err in mine:
        limit = (err.get("ctx") or {}).get("max_length")
        if err["type"] == "string_too_long":
            return TooLarge(f"{_where(err['loc'])} is over {limit} characters")
        if err["type"] == "too_long":
            return TooLarge(f"{_where(err['loc'])} has more than {limit} items")
    if mine[0]["type"] == "missing":
        return InvalidArgument(f"{_where(mine[0]['loc'])} is required; see the tool's input schema")
    # A value of the right type for one member of a union that breaks that member's constraint
    # (chain: "") is about that constraint, not about the other members' types.
    constrained = [e for e in mine if not str(e["type"]).endswith("_type")]
    said = dict.fromkeys(f"{_where(e['loc'])}: {_plain(e['msg'])}" for e in constrained or mine)
    return InvalidArgument("; or ".join(said))


def _where(loc: tuple[int | str, ...]) -> str:
    """``approve_before[1]``, ``usage.input_tokens``, ``budget.steps[0].step``: the argument, the
    fields and the list positions in it; the other strings of a location name union members
    (``str``, ``list[constrained-str]``, a model's class name), not fields."""
    where = str(loc[0])
    for part in loc[1:]:
        if isinstance(part, int):
            where += f"[{part}]"
        elif _FIELD.fullmatch(part) and part not in _TYPE_TAGS:
            where += f".{part}"
    return where


#: a field's name (the arguments' fields are snake_case; union members' tags are not, but these)
_FIELD = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _plain(message: str) -> str:
    # pydantic's messages ("Input should be a valid string") name no input value; keep them short.
    message = message[:1].lower() + message[1:]
    return message if len(message) <= 200 else message[:200] + "..."


def strict_schema(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """The published input schema: no property beyond the declared ones, the configured size
    limits on ``request`` and ``output`` and the cursor's bound (the runtime enforces these
    three), ``null`` allowed for every optional argument (see :func:`_nullable_optional`), and
    portable (see :func:`portable_schema`). The rules portable schemas cannot say (``task_id``
    with ``output``, a bound that excludes its value) the tools check themselves."""
    schema = {**schema, "additionalProperties": False}
    properties = dict(schema.get("properties", {}))
    for name, limit in (
        ("request", limits.max_request_chars),
        ("output", limits.max_output_chars),
        ("cursor", limits.max_cursor_chars),
    ):
        if name in properties:
            properties[name] = _with_max_length(properties[name], limit)
    required = set(schema.get("required", ()))
    schema["properties"] = {
        name: prop if name in required else _nullable_optional(prop) for name, prop in properties.items()
    }
    return portable_schema(schema)


def portable_schema(schema: dict[str, Any]) -> dict[str, Any]:
    r"""``schema`` in the subset of JSON Schema every function-calling dialect takes without loss
    (OpenAI strict mode, Gemini's typed ``Schema``, plain validators): its ``$ref``\ s
    inlined and no ``$defs``; a type list (``[T, "null"]``) as ``anyOf``; ``exclusiveMinimum`` /
    ``exclusiveMaximum`` as the inclusive bound (the server's own validation still refuses the
    bound itself, with ``invalid_argument``); no ``dependentRequired``; no pydantic ``title``; no
    ``default`` of null (what an absent argument means anyway)."""
    defs = schema.get("$defs", {})
    published: dict[str, Any] = _portable(schema, defs)
    return published


NULL_SCHEMA = {"type": "null"}
#: keywords whose value is a map of names to schemas (the names are data, not keywords)
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")
#: keywords a portable schema leaves out (see :func:`portable_schema`)
_DROPPED = frozenset({"$defs", "dependentRequired"})
#: exclusive bounds and the inclusive keyword each one is published as
_INCLUSIVE = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}


def _portable(schema: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(schema, list):
        return [_portable(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        # pydantic's refs name a model of the same schema; none of these models is recursive
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        return _portable({**defs[ref.removeprefix("#/$defs/")], **siblings}, defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED or (key == "title" and isinstance(value, str)):
            continue
        if key == "default" and value is None:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _portable(sub, defs) for name, sub in value.items()}
        elif key in _INCLUSIVE:
            out[_INCLUSIVE[key]] = value
        else:
            out[key] = _portable(value, defs)
    types = out.get("type")
    if isinstance(types, list):
        out = _type_list_as_any_of(out, types)
    return _annotations_in_branch(out)


def _annotations_in_branch(schema: dict[str, Any]) -> dict[str, Any]:
    """``{"anyOf": [X, {"type": "null"}], "description": d}`` (pydantic's ``T | None``) with the
    description and default in ``X``: Gemini's conversion makes the pair a nullable ``X`` and
    drops what stood beside the ``anyOf``. (A reused type's own description in ``X``, RunId's,
    says less than the argument's, which replaces it.)"""
    branches = schema.get("anyOf")
    if not (isinstance(branches, list) and len(branches) == 2 and NULL_SCHEMA in branches):
        return schema
    (other,) = [b for b in branches if b != NULL_SCHEMA]
    moved = {k: v for k, v in schema.items() if k in ("description", "default")}
    if not moved or not isinstance(other, dict):
        return schema
    rest = {k: v for k, v in schema.items() if k not in moved and k != "anyOf"}
    return {"anyOf": [{**other, **moved}, NULL_SCHEMA], **rest}


def _type_list_as_any_of(schema: dict[str, Any], types: list[Any]) -> dict[str, Any]:
    """``{"type": [T, "null"], ...}`` as ``{"anyOf": [{"type": T, ...}, {"type": "null"}]}``
    (keywords about the value go into the branch; a description stays beside the ``anyOf``)."""
    outer = {k: v for k, v in schema.items() if k in ("description", "default")}
    inner = {k: v for k, v in schema.items() if k not in outer and k != "type"}
    branches = [{"type": t, **inner} if t != "null" else {"type": "null"} for t in types]
    return {"anyOf": branches, **outer}


def _nullable_optional(prop: dict[str, Any]) -> dict[str, Any]:
    """An optional argument's schema with ``null`` allowed (meaning: not given), as a strict model
    sends every optional argument it does not set (OpenAI strict mode makes every property
    required). :class:`_VerbatimText` then treats a null argument as an omitted one."""
    branches = prop.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches:
        return prop
    outer = {k: v for k, v in prop.items() if k in ("description", "default")}
    inner = {k: v for k, v in prop.items() if k not in outer}
    if isinstance(branches, list) and not inner.keys() - {"anyOf"}:
        return {**outer, "anyOf": [*branches, {"type": "null"}]}
    return {**outer, "anyOf": [inner, {"type": "null"}]}


def _with_max_length(prop: dict[str, Any], limit: int) -> dict[str, Any]:
    if "anyOf" in prop:  # an optional string: string | null
        branches = [_with_max_length(b, limit) if b.get("type") == "string" else b for b in prop["anyOf"]]
        return {**prop, "anyOf": branches}
    return {**prop, "maxLength": limit}
