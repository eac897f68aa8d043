"""The one thing a command module needs of ``argparse``'s sub-command object: adding a parser.

``ArgumentParser.add_subparsers`` returns an object of a private class; a command module that adds
its own commands (``runs fork``, ``runs tail``, ``runs export``, ...) asks only for this."""

from __future__ import annotations

import argparse
from typing import Any, Protocol


class Subcommands(Protocol):
    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...
