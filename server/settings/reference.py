"""The reference table of the environment variables, rendered from the settings model.

Each field of :class:`server.settings.config.Settings` that a variable sets gives one row: its
variables, its config-file key, its default and its description. The README's Configuration section
holds the rendered table between two markers; a test fails when the two differ, and
``python -m server.settings.reference README.md`` rewrites the README's copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from server.settings.config import Settings
from server.settings.sources import Env, env_fields, file_keys

BEGIN = "<!-- the environment variables, rendered from the settings model by server/settings/reference.py -->"
END = "<!-- end of the generated table -->"

_HEADER = "| variable | config file | default | what it sets |\n|---|---|---|---|\n"


def _default(field: FieldInfo, variable: Env) -> str:
    if variable.shown_default is not None:
        return variable.shown_default
    value = field.default
    if value is PydanticUndefined or value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return f"`{value}`"
    return str(value)


def _file_key(name: str, variable: Env, keys: set[str]) -> str:
    if name in keys:
        return f"`{name}`"
    if variable.in_table is not None:
        table, key = variable.in_table
        return f"`{key}` under `[{table}]`"
    return "—"


def _variables(variable: Env) -> str:
    names = [f"{variable.names[0]}*"] if variable.prefix else list(variable.names)
    return ", ".join(f"`{n}`" for n in names)


def environment_table() -> str:
    """The markdown table of every environment variable of the settings, in the model's order."""
    keys = set(file_keys(Settings))
    rows = [
        f"| {_variables(variable)} | {_file_key(name, variable, keys)} | {_default(field, variable)} "
        f"| {field.description or ''} |\n"
        for name, field, variable in env_fields(Settings)
    ]
    return _HEADER + "".join(rows)


def with_table(text: str) -> str:
    """``text`` (the README) with the table between the markers rendered anew. Raises ValueError
    when the markers are missing."""
    start = text.index(BEGIN) + len(BEGIN)
    end = text.index(END, start)
    return f"{text[:start]}\n{environment_table()}{text[end:]}"


def main(argv: list[str]) -> int:
    """``python -m server.settings.reference [README.md]``: print the table, or rewrite the file's."""
    if not argv:
        sys.stdout.write(environment_table())
        return 0
    path = Path(argv[0])
    path.write_text(with_table(path.read_text("utf-8")), "utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
