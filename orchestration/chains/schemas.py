"""Typed step outputs: the built-in output schemas, schema checks, and validation of an answer.

A step's schema is resolved at load (:func:`resolve_schema`) and kept in the run's chain snapshot,
so resuming never depends on the configuration; every answer, a provider's or a host's, passes
:func:`validate_output` before it is recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # ships no type information
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from orchestration.core.models import canonical_json
from orchestration.errors import InvalidOutput, quoted

__all__ = [
    "BUILTIN_SCHEMAS",
    "MAX_SCHEMA_CHARS",
    "answer_format",
    "check_schema",
    "resolve_schema",
    "validate_output",
]

#: The built-in output schemas a step may name (``output_schema = "verdict"``).
BUILTIN_SCHEMAS: Final[Mapping[str, Mapping[str, Any]]] = {
    "verdict": {
        "type": "object",
        "properties": {
            "verdict": {"enum": ["approve", "revise", "reject"]},
            "notes": {"type": "string"},
        },
        "required": ["verdict", "notes"],
        "additionalProperties": False,
    },
}

#: The largest schema a chain may declare (its canonical JSON, in characters). A schema travels in
#: every prompt and request of its step and in the run's chain snapshot.
MAX_SCHEMA_CHARS: Final = 20_000

#: At most this many schema violations are named in one error.
MAX_REPORTED_ERRORS: Final = 3

#: A validation message (which may quote the offending value) is cut to this many characters.
_MESSAGE_CHARS: Final = 160

# One ```json (or plain ```) fenced block around the whole answer, and nothing else.
_FENCED = re.compile(r"\A\s*```(?:json)?[ \t]*\n(?P<body>.*?)\n[ \t]*```\s*\Z", re.DOTALL | re.IGNORECASE)


def check_schema(schema: object) -> dict[str, Any]:
    """``schema`` as a step's output schema, or ``ValueError`` saying what is wrong: it must be a
    valid JSON Schema (draft 2020-12) of at most :data:`MAX_SCHEMA_CHARS` characters whose top level
    is ``"type": "object"`` (routing reads the answer's fields)."""
    if not isinstance(schema, Mapping):
        raise ValueError("must be the name of a built-in schema or a table holding a JSON Schema")
    size = len(canonical_json(schema))
    if size > MAX_SCHEMA_CHARS:
        raise ValueError(f"is {size} characters as JSON; a schema has at most {MAX_SCHEMA_CHARS}")
    # TOML values become plain JSON values (a TOML date becomes its ISO text)
    as_json = json.loads(canonical_json(schema))
    try:
        Draft202012Validator.check_schema(as_json)
    except SchemaError as exc:
        where = _pointer(exc.absolute_path)
        raise ValueError(f"is not a valid JSON Schema: at {where}: {_cut(exc.message)}") from None
    if as_json.get("type") != "object":
        raise ValueError('must describe an object: give it "type": "object" at the top level')
    _check_refs(as_json)
    return dict(as_json)


def _check_refs(schema: dict[str, Any]) -> None:
    """Every ``$ref`` points inside the schema (``#/$defs/...``) at something that is there:
    nothing is fetched from elsewhere, and a dangling reference is found now, not when an answer
    is validated."""
    uri = "urn:construct:output-schema"
    resolver = Registry().with_resource(uri, DRAFT202012.create_resource(schema)).resolver(base_uri=uri)
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise ValueError(
                f"$ref {quoted(ref)} is not inside the schema; use #/$defs/... (nothing is fetched)"
            )
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ValueError(f"$ref {quoted(ref)} points at nothing in the schema") from None


def _refs(node: object) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def resolve_schema(spec: object) -> dict[str, Any]:
    """A step's ``output_schema`` as written in a chain definition (a built-in name or a JSON
    Schema) resolved to the schema itself; ``ValueError`` when it is neither."""
    if isinstance(spec, str):
        builtin = BUILTIN_SCHEMAS.get(spec)
        if builtin is None:
            raise ValueError(
                f"unknown built-in schema {quoted(spec)}; built-in: {', '.join(sorted(BUILTIN_SCHEMAS))} "
                "(or give a JSON Schema as a table)"
            )
        return json.loads(canonical_json(builtin))  # type: ignore[no-any-return]
    return check_schema(spec)


def validate_output(schema: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The value of the answer ``text`` for a step whose output schema is ``schema``.

    ``text`` must be a JSON object, optionally inside one fenced block (```` ```json ... ``` ````)
    and nothing else around it. Raises :class:`~orchestration.errors.InvalidOutput`
    (``invalid_output``) saying what is wrong and where: the JSON parse error with its position, or
    up to :data:`MAX_REPORTED_ERRORS` schema violations each with its JSON pointer. A message quotes
    at most about 100 characters of the answer.
    """
    fenced = _FENCED.match(text)
    body = fenced.group("body") if fenced else text
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise InvalidOutput(
            f"the answer is not JSON ({_json_problem(exc)}); it starts {quoted(body.strip())}. "
            "Answer with only a JSON object matching the output schema"
        ) from None
    errors = sorted(
        Draft202012Validator(schema).iter_errors(value),
        key=lambda e: (list(map(str, e.absolute_path)), e.message),
    )
    if errors:
        shown = "; ".join(
            f"at {_pointer(e.absolute_path)}: {_cut(e.message)}" for e in errors[:MAX_REPORTED_ERRORS]
        )
        more = len(errors) - MAX_REPORTED_ERRORS
        if more > 0:
            shown += f"; and {more} more"
        raise InvalidOutput(f"the answer does not match the output schema: {shown}")
    if not isinstance(value, dict):  # only reachable with a schema that is not type: object
        raise InvalidOutput("the answer is not a JSON object")
    return value


def answer_format(schema: Mapping[str, Any]) -> str:
    """The "Answer format" prompt section for a step with an output schema (deterministic text)."""
    return (
        "Answer with one JSON object that matches this JSON Schema, and nothing else "
        "(no prose before or after it):\n\n" + canonical_json(schema)
    )


def _json_problem(exc: ValueError | RecursionError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    return str(exc)


def _pointer(path: Iterable[Any]) -> str:
    """A JSON pointer (RFC 6901) for a path; ``(root)`` for the whole document."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else "(root)"


def _cut(message: str) -> str:
    return message if len(message) <= _MESSAGE_CHARS else message[: _MESSAGE_CHARS - 1] + "…"
