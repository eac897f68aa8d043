"""What the stdio transport's early answers depend on (the size limits, whether the backend is
``provider``), read with the standard library alone, before the settings (and through them the MCP
SDK) are imported. :func:`early_settings` reads them as :func:`server.settings.config.load_settings`
does and says "surely" only when nothing is in doubt; ``tests/unit/server/test_early_initialize.py``
holds it to ``load_settings``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: As in :mod:`server.settings.config` (a test keeps them the same).
DEFAULT_HOME = "~/.construct"
CONFIG_FILE_NAME = "construct.toml"
HOME_VARIABLE = "CONSTRUCT_HOME"
BACKEND_VARIABLE = "CONSTRUCT_WORKER_BACKEND"
BACKEND_KEY = "worker_backend"
INLINE = "inline"
#: the settings the tools' definitions depend on (config file key -> environment variable)
LIMITS = {
    "max_request_chars": "CONSTRUCT_MAX_REQUEST_CHARS",
    "max_output_chars": "CONSTRUCT_MAX_OUTPUT_CHARS",
}


@dataclass(frozen=True)
class EarlySettings:
    """What is sure before the settings are loaded."""

    #: the worker backend is ``inline``: the instructions carry no warning
    inline: bool
    #: the size limits are the defaults: the tools are listed as for the default settings
    default_limits: bool


UNSURE = EarlySettings(inline=False, default_limits=False)


def early_settings(
    home: str | None = None, config_file: str | None = None, env: Mapping[str, str] | None = None
) -> EarlySettings:
    """What is sure of the settings ``--home home --config config_file`` and ``env`` (default: the
    process environment) resolve to, without loading them."""
    env = os.environ if env is None else env
    raw_home = home if home is not None else env.get(HOME_VARIABLE) or DEFAULT_HOME
    if not raw_home.strip():
        return UNSURE  # a configuration error, for the settings to report
    named = home is not None or HOME_VARIABLE in env
    if not _could_be_a_home(Path(raw_home).expanduser(), relative_allowed=home is not None, named=named):
        # The settings refuse it and the server exits at once: no answer must make a host take it
        # for a server that started (see server.settings.config.check_home).
        return UNSURE
    path = Path(config_file) if config_file is not None else Path(raw_home).expanduser() / CONFIG_FILE_NAME
    table: dict[str, object] = {}
    try:
        if config_file is not None or path.is_file():
            table = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return UNSURE
    inline = (
        table[BACKEND_KEY] == INLINE if BACKEND_KEY in table else env.get(BACKEND_VARIABLE, INLINE) == INLINE
    )
    default_limits = not any(key in table or variable in env for key, variable in LIMITS.items())
    return EarlySettings(inline=inline, default_limits=default_limits)


def _could_be_a_home(home: Path, relative_allowed: bool, named: bool) -> bool:
    """False for a home the settings refuse (:func:`server.settings.config.check_home`): a
    relative ``CONSTRUCT_HOME``; a path that is, or is under, something other than a directory; a
    named home this user cannot write or create."""
    if not relative_allowed and not home.is_absolute():
        return False
    home = home.absolute()
    existing = next(p for p in (home, *home.parents) if p.exists())
    return existing.is_dir() and (not named or os.access(existing, os.W_OK | os.X_OK))


__all__ = ["UNSURE", "EarlySettings", "early_settings"]
