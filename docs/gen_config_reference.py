"""Render docs/reference/configuration.md from the settings model (issue 26).

``python docs/gen_config_reference.py`` writes the page; ``--check`` exits 1 when the committed page
differs from what the model renders (a test runs it, so a setting added, renamed or re-described
without the page fails the tests).

The page has every setting of :class:`server.settings.config.Settings` that a reader can set — its
environment variables, its config-file key (top level, or under a table), its type, its default and
its description — and every table of the config file (``[providers.NAME]``, ``[tokens.IDENTITY]``,
``[auth]``, ``[agents.NAME]``, ``[prices."MODEL"]``, ``[budgets.CHAIN]``) with the keys of its model. Fields
the process sets for itself (the file read, where each value came from) are not settings and are
left out; so are the catalog's ``[specialists]`` and ``[chains]`` tables, which the chains page
describes.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from server.settings.config import CONFIG_FILE_NAME, Settings
from server.settings.sources import Env, env_of, file_keys, table_of

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "configuration.md"
COMMAND = "python docs/gen_config_reference.py"

#: How a table's name is written in its header (default ``NAME``).
_TABLE_NAMES = {"tokens": "IDENTITY", "prices": '"MODEL"', "budgets": "CHAIN"}
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_SCALARS: dict[object, str] = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}

_INTRO = f"""# Configuration reference

<!-- Generated from the settings model (server/settings/) by docs/gen_config_reference.py: do not
edit by hand; run `{COMMAND}` (a test fails when this page is out of date). -->

Every setting, from the settings model. A setting comes from, highest first: a command-line flag
(`--store`, `--home`, `--log-level`, ...), the config file, an environment variable, the default.
The config file is `--config FILE`, else `{CONFIG_FILE_NAME}` in the state directory
(`CONSTRUCT_HOME`, default `~/.construct`) when it exists. A bad value stops the process with an
error that names where it came from (the file, `environment` or `command line`), the key and what is
wrong; an unknown key gets the nearest known one.
"""


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_text(annotation: object) -> str:
    """A field's type in words: ``integer``, ``string or none``, ``one of "a", "b"``, ``list of ...``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "none"
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is typing.Literal:
        return "one of " + ", ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):  # None: not set (the default says what that means)
        return " or ".join(_type_text(a) for a in args if a is not type(None))
    if origin in (list, tuple):
        return f"list of {_type_text(args[0])}"
    if origin is dict:
        value = args[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return "table of tables with the keys " + ", ".join(f"`{k}`" for k in value.model_fields)
        return f"table of {_type_text(value)}"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _is_text(annotation: object) -> bool:
    """Whether a length limit counts characters (a string, optional or not) rather than items."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return annotation is str or (union and str in typing.get_args(annotation))


def _bounds(field: FieldInfo) -> str:
    """The field's limits: ``≥ 1``, ``≤ 3600``, ``1-200 characters``."""
    words = []
    for meta in field.metadata:
        if isinstance(meta, Ge):
            words.append(f"≥ {_number(meta.ge)}")
        elif isinstance(meta, Gt):
            words.append(f"> {_number(meta.gt)}")
        elif isinstance(meta, Le):
            words.append(f"≤ {_number(meta.le)}")
        elif isinstance(meta, Lt):
            words.append(f"< {_number(meta.lt)}")
        elif isinstance(meta, MinLen) and meta.min_length > 1:
            words.append(f"at least {meta.min_length} {_unit(field)}")
        elif isinstance(meta, MaxLen):
            words.append(f"at most {meta.max_length} {_unit(field)}")
    return ", ".join(words)


def _unit(field: FieldInfo) -> str:
    return "characters" if _is_text(field.annotation) else "items"


def _number(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _default_text(field: FieldInfo, variable: Env | None) -> str:
    if variable is not None and variable.shown_default is not None:
        return variable.shown_default
    if field.default is PydanticUndefined:
        return "required" if field.default_factory is None else "—"
    value = field.default
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{_number(value)}`"


def _described(field: FieldInfo) -> str:
    type_text = _type_text(field.annotation)
    bounds = _bounds(field)
    return _escape(f"{type_text}, {bounds}" if bounds else type_text)


def _settings_rows() -> Iterator[str]:
    keys = set(file_keys(Settings))
    for name, field in Settings.model_fields.items():
        variable = env_of(field)
        if variable is None:
            continue  # a table (below), or set by the process itself
        names = [f"{variable.names[0]}*"] if variable.prefix else list(variable.names)
        if name in keys:
            key = f"`{name}`"
        elif variable.in_table is not None:
            key = f"`{variable.in_table[1]}` under `[{variable.in_table[0]}]`"
        else:
            key = "—"
        yield (
            f"| {', '.join(f'`{n}`' for n in names)} | {key} | {_described(field)} "
            f"| {_default_text(field, variable)} | {_escape(field.description or '')} |"
        )


def _table_model(field: FieldInfo) -> tuple[str | None, type[BaseModel]]:
    """A table field's key type (in words; None for a single table such as ``[auth]``) and the model
    of one table."""
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
        return None, field.annotation
    key, model = typing.get_args(field.annotation)
    assert isinstance(model, type) and issubclass(model, BaseModel), field
    return _type_text(key), model


def _table_section(name: str, field: FieldInfo) -> Iterator[str]:
    key_type, model = _table_model(field)
    header = f"[{name}]" if key_type is None else f"[{name}.{_TABLE_NAMES.get(name, 'NAME')}]"
    yield f"### `{header}`"
    yield ""
    about = [_sentence(field.description or "")]
    if key_type is not None and key_type.startswith("one of"):
        about.append(f"The table's name is {key_type}.")
    if not model.__module__.startswith("server.settings"):
        # a record of the runs (orchestration.core), described by its docstring, not field by field
        about.append(_markdown(" ".join((model.__doc__ or "").split())))
    yield _escape(" ".join(a for a in about if a))
    yield ""
    yield "| key | type | default | what it sets |"
    yield "|---|---|---|---|"
    for key, sub in model.model_fields.items():
        what = _escape(sub.description or "—")
        yield f"| `{key}` | {_described(sub)} | {_default_text(sub, None)} | {what} |"
    yield ""


def _sentence(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}." if text else ""


def _markdown(docstring: str) -> str:
    """reStructuredText's inline markup as markdown: ``x`` and :role:`x` become `x`."""
    return _ROLE.sub(r"`\1`", docstring).replace("``", "`")


def render() -> str:
    """The whole page, from the model."""
    lines = [
        _INTRO,
        "## Settings",
        "",
        "A setting the config file does not take (`—`) is set by its environment variable only; the "
        "first variable of a row that is set and not empty wins.",
        "",
        "| environment variable | config file | type | default | what it sets |",
        "|---|---|---|---|---|",
        *_settings_rows(),
        "",
        "## Tables of the config file",
        "",
        "Besides its top-level keys, the config file holds tables of these kinds, each as many times as "
        "it names them (and the catalog's `[specialists.NAME]` and `[chains.NAME]`, on the chains page).",
        "",
    ]
    for name, field in Settings.model_fields.items():
        if table_of(field) is not None:
            lines.extend(_table_section(name, field))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None, page_path: Path = PAGE) -> int:
    """Write the page at ``page_path``, or with ``--check`` compare it: 1 when it differs."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page is out of date")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = page_path.read_text("utf-8") if page_path.is_file() else None
        if current != page:
            print(f"{page_path} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_text(page, "utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
