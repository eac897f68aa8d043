"""The CLI's usage error: a command line that cannot be acted on (exit status 2), raised by the
command modules for the flags they check themselves (flags that go together, a value argparse
cannot check), and said by :func:`server.cli.main.run`."""

from __future__ import annotations

from orchestration.errors import ConstructError


class UsageError(Exception):
    """A command line that cannot be acted on (exit status 2). ``error``: the project's error that
    says what is wrong (``--gate-id`` and the gate the run waits at), printed as its
    ``code: message`` line like any other; else the message is the exception's own."""

    def __init__(self, message: str = "", error: ConstructError | None = None) -> None:
        super().__init__(message or (str(error) if error is not None else ""))
        self.error = error
