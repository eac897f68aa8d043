"""Where settings come from: the command line, the config file and the environment, as
``pydantic-settings`` sources of one model (:class:`server.settings.config.Settings`); a field's
:class:`Env` metadata names its variables, :class:`Table` marks a table of the file. Each source
validates its own values before they are merged, so a bad value is refused, naming its source, even
where a higher source overrides it.
"""

from __future__ import annotations

import tomllib
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    TomlConfigSettingsSource,
)

from orchestration.errors import ConfigError, did_you_mean, plain_problem

if TYPE_CHECKING:
    from pydantic_settings.sources.types import Traversable

#: Tables of the config file that belong to the catalog, not to the server settings.
CATALOG_TABLES = frozenset({"specialists", "chains"})
#: ``Env.not_in_file`` of a field that is no config-file key at all (the file's unknown key).
NO_FILE_KEY = "unknown setting"


@dataclass(frozen=True, slots=True)
class Env:
    """The environment variables that set a field, in order: the first one set and not empty wins.
    ``prefix``: every variable whose name starts with ``names[0]`` (a field holding a mapping).
    ``not_in_file``: the field is not a config-file key; what to tell someone who writes it there.
    ``keep_empty``: a variable set but empty counts (and is validated) instead of counting as unset."""

    names: tuple[str, ...]
    not_in_file: str | None = None
    keep_empty: bool = False
    prefix: bool = False
    #: ``(table, key)``: the config file sets this under ``[table] key`` instead.
    in_table: tuple[str, str] | None = None
    #: The default as the reference table shows it, where the field's own would mislead.
    shown_default: str | None = None


def from_env(
    *names: str,
    not_in_file: str | None = None,
    keep_empty: bool = False,
    prefix: bool = False,
    in_table: tuple[str, str] | None = None,
    shown_default: str | None = None,
) -> Env:
    if in_table is not None:
        not_in_file = f"write {in_table[1]} under [{in_table[0]}] instead"
    return Env(names, not_in_file, keep_empty, prefix, in_table, shown_default)


@dataclass(frozen=True, slots=True)
class Table:
    """A ``[<field>.<name>]`` table of the config file. ``unknown``: what to say of a key the table
    does not take (default: the keys it takes, from its model)."""

    noun: str
    unknown: str | None = None


_T = TypeVar("_T")


def _meta(field: FieldInfo, kind: type[_T]) -> _T | None:
    return next((m for m in field.metadata if isinstance(m, kind)), None)


def env_of(field: FieldInfo) -> Env | None:
    return _meta(field, Env)


def table_of(field: FieldInfo) -> Table | None:
    return _meta(field, Table)


def file_keys(settings_cls: type[BaseModel]) -> list[str]:
    """The config file's keys for the settings (the catalog's tables aside), in the model's order."""
    keys = []
    for name, field in settings_cls.model_fields.items():
        variable = env_of(field)
        if table_of(field) is not None or (variable is not None and variable.not_in_file is None):
            keys.append(name)
    return keys


def env_fields(settings_cls: type[BaseModel]) -> Iterator[tuple[str, FieldInfo, Env]]:
    for name, field in settings_cls.model_fields.items():
        variable = env_of(field)
        if variable is not None:
            yield name, field, variable


def _table_model(field: FieldInfo) -> type[BaseModel] | None:
    """The model of one table of a ``dict[str, Model]`` field, or of a single-table field."""
    model = (typing.get_args(field.annotation) or (field.annotation,))[-1]
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _problem(settings_cls: type[BaseModel], exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if p != "[key]"]
    where = (
        "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" if i else str(p)
            for i, p in enumerate(q for q in err["loc"] if q != "[key]")
        )
        or "(file)"
    )
    message = plain_problem(err)
    if err["type"] == "extra_forbidden":
        field = settings_cls.model_fields.get(loc[0])
        table = None if field is None else table_of(field)
        if len(loc) == 1 or field is None or table is None:
            message = _unknown_setting(settings_cls, loc[0])
        elif table.unknown is not None:
            message = f"unknown setting; {table.unknown}"
        else:
            model = _table_model(field)
            known = list(model.model_fields) if model is not None else []
            hint = did_you_mean(loc[-1], known)
            message = (
                f"unknown setting{hint}"
                if hint
                else f"unknown setting; {table.noun} takes: {', '.join(known)}"
            )
    return where, message


def _unknown_setting(settings_cls: type[BaseModel], name: str) -> str:
    """What to say of the unknown top-level ``name``: the close known setting or table, else all."""
    keys = sorted(file_keys(settings_cls))
    hint = did_you_mean(name, [*keys, *CATALOG_TABLES])
    if hint:
        return f"unknown setting{hint}"
    return (
        f"unknown setting; the known settings are: {', '.join(keys)} "
        "(and the tables specialists, chains, providers, tokens, auth, agents, a2a)"
    )


def validated(
    settings_cls: type[BaseModel], source: str, values: Mapping[str, Any], name_of: Mapping[str, str]
) -> None:
    """Check ``values`` (one source's) against the model's fields: raise the ConfigError naming
    ``source`` and the field as that source calls it (``name_of``)."""
    try:
        settings_cls.model_validate(dict(values))
    except ValidationError as exc:
        where, message = _problem(settings_cls, exc)
        raise ConfigError(source, name_of.get(where, where), message) from None


class FlagSource(InitSettingsSource):
    """The command line: settings field -> value, None meaning "not given"."""

    def __init__(self, settings_cls: type[BaseSettings], flags: Mapping[str, Any]) -> None:
        given = {k: v for k, v in flags.items() if v is not None}
        self.labels = {name: "--" + name.replace("_", "-") for name in given}
        allowed = {name for name, _, variable in env_fields(settings_cls) if not variable.prefix}
        allowed |= set(file_keys(settings_cls))
        allowed -= {"home"}  # --home chooses where the config file is: resolved before the sources
        if unknown := sorted(given.keys() - allowed):
            raise ConfigError(
                "command line", self.labels[unknown[0]], _unknown_setting(settings_cls, unknown[0])
            )
        validated(settings_cls, "command line", given, self.labels)
        super().__init__(settings_cls, given)


class ConfigFileSource(TomlConfigSettingsSource):
    """The config file's top-level keys (its ``[specialists]`` and ``[chains]`` tables are the
    catalog's, read by :meth:`orchestration.chains.catalog.Catalog.load`)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self.path = path
        self._settings_cls = settings_cls
        if not path.is_file():
            self._read_file(path)  # raises what is wrong: missing, a directory, unreadable
        super().__init__(settings_cls, toml_file=path)
        self.labels = dict.fromkeys(self.toml_data, "config")

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        source = str(self.path)
        try:
            raw = tomllib.loads(file_path.read_text("utf-8"))
        except FileNotFoundError:
            raise ConfigError(source, "(file)", "the file does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(source, "(file)", f"cannot be read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, "(file)", f"is not valid TOML: {exc}") from None
        values = {k: v for k, v in raw.items() if k not in CATALOG_TABLES}
        fields = self._settings_cls.model_fields
        unknown = sorted(values.keys() - set(file_keys(self._settings_cls)))
        for key in unknown:  # a field only the environment sets says what to write instead
            variable = env_of(fields[key]) if key in fields else None
            if variable is not None and variable.not_in_file not in (None, NO_FILE_KEY):
                raise ConfigError(source, key, variable.not_in_file)
        validated(self._settings_cls, source, {k: v for k, v in values.items() if k not in unknown}, {})
        if unknown:
            raise ConfigError(source, unknown[0], _unknown_setting(self._settings_cls, unknown[0]))
        return values


class EnvironmentSource(PydanticBaseSettingsSource):
    """The environment variables the fields name (:class:`Env`), read from ``environ`` (the process
    environment, or a mapping a test or the demo gives). ``skip``: fields resolved before."""

    def __init__(
        self, settings_cls: type[BaseSettings], environ: Mapping[str, str], skip: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(settings_cls)
        self.values: dict[str, Any] = {}
        self.labels: dict[str, str] = {}
        for name, _field, variable in env_fields(settings_cls):
            if name in skip:
                continue
            if variable.prefix:
                found = {k: v for k, v in environ.items() if k.startswith(variable.names[0])}
                if found:
                    self.values[name] = found
                continue
            for var in variable.names:
                value = environ.get(var)
                if value is not None and (value != "" or variable.keep_empty):
                    self.values[name], self.labels[name] = value, var
                    break
        validated(settings_cls, "environment", self.values, self.labels)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


__all__ = [
    "CATALOG_TABLES",
    "NO_FILE_KEY",
    "ConfigFileSource",
    "Env",
    "EnvironmentSource",
    "FlagSource",
    "Table",
    "env_fields",
    "env_of",
    "file_keys",
    "from_env",
    "table_of",
    "validated",
]
