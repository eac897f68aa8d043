"""Whether the worker backend is surely ``inline``, found without loading the settings.

The ``instructions`` a host receives carry a warning only when the worker backend is ``provider``
(:func:`server.settings.providers.missing_key_warning`). The stdio transport answers ``initialize``
before anything heavy is imported (:mod:`server.transports.handshake`), and loading the settings
imports the domain and, through it, the MCP SDK. So this reads the one setting that decides it the
way :func:`server.settings.config.load_settings` does (the config file over the environment over the
default; ``serve`` has no flag for it), with the standard library alone, and says "surely inline"
only when nothing is in doubt: a file it cannot read or parse, or any value but ``inline``, leaves
the answer to the server once its settings are loaded. ``tests/unit/server/test_early_initialize.py``
holds it to :func:`~server.settings.config.load_settings`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

#: As in :mod:`server.settings.config` (a test keeps them the same).
DEFAULT_HOME = "~/.construct"
CONFIG_FILE_NAME = "construct.toml"
HOME_VARIABLE = "CONSTRUCT_HOME"
BACKEND_VARIABLE = "CONSTRUCT_WORKER_BACKEND"
BACKEND_KEY = "worker_backend"
INLINE = "inline"


def surely_inline(
    home: str | None = None, config_file: str | None = None, env: Mapping[str, str] | None = None
) -> bool:
    """True when the settings ``--home home --config config_file`` and ``env`` (default: the process
    environment) would resolve have the worker backend ``inline``; False when it is ``provider``
    or cannot be known cheaply."""
    env = os.environ if env is None else env
    raw_home = home if home is not None else env.get(HOME_VARIABLE) or DEFAULT_HOME
    if not raw_home.strip():
        return False  # a configuration error, for the settings to report
    path = Path(config_file) if config_file is not None else Path(raw_home).expanduser() / CONFIG_FILE_NAME
    try:
        if config_file is not None or path.is_file():
            table = tomllib.loads(path.read_text("utf-8"))
            if BACKEND_KEY in table:
                return bool(table[BACKEND_KEY] == INLINE)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return env.get(BACKEND_VARIABLE, INLINE) == INLINE


__all__ = ["surely_inline"]
