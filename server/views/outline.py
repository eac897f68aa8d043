"""The published shape of a tool's answer: an *outline* of its JSON schema (see :class:`Outlined`).

The whole nested schema of a run view, repeated by each tool that answers with one, made
``tools/list`` about 60 KB, which a host pays for in every conversation. An outline names the
view's own fields with their types and shows nested objects as plain objects described in a
sentence; the answer still validates against it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


class View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Outlined(View):
    """A view whose JSON schema is an outline: its own fields, nested objects as plain objects.

    The outline is derived from the full schema, so it stays true as the fields change: titles,
    defaults, nested models' definitions and the descriptions of plain fields are left out, enums
    are kept inline. Validation is unaffected (the model still validates every nested field); only
    the published schema is lean.

    A view that sets :attr:`published` publishes only those fields (the ones a host reads) and
    allows the others (``additionalProperties: true``): the answer still validates against it.
    """

    #: The fields the outline names; None: all of them.
    published: ClassVar[tuple[str, ...] | None] = None
    #: True: the outline names each published field by its JSON type only — no enum, no
    #: description, a list's items by their type (what the fields hold is documented; repeated by
    #: every tool that publishes the view, the words cost ``tools/list`` bytes each time).
    bare: ClassVar[bool] = False

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        full = handler.resolve_ref_schema(handler(core_schema))
        # The tool's description says what it answers; the model's docstring would repeat it.
        outline = {k: v for k, v in _outline(full, handler, root=True).items() if k != "description"}
        if cls.published is not None:
            keep = cls.published
            outline["properties"] = {k: v for k, v in outline["properties"].items() if k in keep}
            outline["required"] = [k for k in outline.get("required", []) if k in keep]
            outline["additionalProperties"] = True
        if cls.bare:
            outline["properties"] = {k: _bare(v) for k, v in outline["properties"].items()}
            outline.pop("additionalProperties", None)  # open: the default
        return outline


def _bare(prop: dict[str, Any]) -> dict[str, Any]:
    """A field of a bare outline: its type (and its items' type), nothing else."""
    lean = {"type": prop["type"]} if "type" in prop else {}
    if "items" in prop:
        lean["items"] = _bare(prop["items"])
    return lean


def _outline(node: dict[str, Any], handler: GetJsonSchemaHandler, root: bool = False) -> dict[str, Any]:
    said = {"description": node["description"]} if "description" in node else {}
    if "$ref" in node:
        target = handler.resolve_ref_schema({"$ref": node["$ref"]})
        if "enum" in target:
            return {key: target[key] for key in ("type", "enum") if key in target} | said
        return {"type": "object"} | said
    if not root and node.get("type") == "object":
        return {"type": "object"} | said
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "default", "discriminator"):
            continue
        if key in ("anyOf", "oneOf"):
            variants: list[dict[str, Any]] = []
            for variant in value:
                lean = _outline(variant, handler)
                if lean not in variants:
                    variants.append(lean)
            types = [v.get("type") for v in variants]
            if len(variants) == 1:
                out.update(variants[0])
            elif all(isinstance(t, str) and v == {"type": t} for t, v in zip(types, variants, strict=True)):
                out["type"] = types  # {"anyOf": [{"type": "object"}, {"type": "null"}]}, said shorter
            else:
                out[key] = variants
        elif key == "items":
            out[key] = _outline(value, handler)
        elif key == "properties":
            out[key] = {name: _outline_property(prop, handler) for name, prop in value.items()}
        else:
            out[key] = value
    return out


def _outline_property(prop: dict[str, Any], handler: GetJsonSchemaHandler) -> dict[str, Any]:
    """A field of the outline. Its description is kept only where the outline hides a shape (an
    object or a list of objects), so that words say what the schema no longer does."""
    lean = _outline(prop, handler)
    if not _holds_objects(lean):
        lean.pop("description", None)
    return lean


def _holds_objects(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return (
        "object" in kinds
        or any(_holds_objects(v) for v in node.get("anyOf", []))
        or ("items" in node and _holds_objects(node["items"]))
    )
