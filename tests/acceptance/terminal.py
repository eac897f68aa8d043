"""The command line where a person uses it: a real ``construct-mcp`` process on a pseudo-terminal.

:class:`Terminal` starts the CLI with a pty as its stdin, stdout and stderr (so it sees a terminal,
as at a shell prompt), reads what it prints as it prints it, and sends what a person sends: Ctrl-C
(SIGINT to the process group, as the terminal driver does). What it read is kept whole
(:attr:`Terminal.screen`), with the terminal's ``\\r\\n`` line ends made ``\\n``.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.acceptance.harness import SERVER_COMMAND

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """One CLI process on a pseudo-terminal (use it as a context manager)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> None:
        self.args = [*SERVER_COMMAND, *args]
        self.env = {"PATH": os.environ.get("PATH", ""), "TERM": "xterm", **env}
        self.cwd = cwd
        self.screen = ""
        self._fd = -1
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        main, child = pty.openpty()
        self.process = subprocess.Popen(
            self.args,
            stdin=child,
            stdout=child,
            stderr=child,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group, as a shell's foreground job
        )
        os.close(child)
        self._fd = main
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _read(self, timeout: float) -> bool:
        """Read what is there within ``timeout`` seconds; False once the process closed the pty."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self._fd, 65536)
        except OSError:  # EIO: every end of the pty's other side is closed
            return False
        if not data:
            return False
        self.screen += _ANSI.sub("", data.decode("utf-8", "replace").replace("\r\n", "\n"))
        return True

    def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """Read until ``pattern`` (a regex) appears in what was printed; AssertionError after
        ``timeout`` seconds, showing what was printed."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.screen)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.2)):
                found = re.search(pattern, self.screen)
                if found is not None:
                    return found
                raise AssertionError(f"{pattern!r} was not printed; the terminal shows:\n{self.screen}")

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the process group."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGINT)

    def wait(self, timeout: float = 60.0) -> int:
        """Read to the end and return the exit status."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while self._read(0.2) and time.monotonic() < deadline:
            if self.process.poll() is not None:
                while self._read(0.05):  # what is still in the pty
                    if not select.select([self._fd], [], [], 0)[0]:
                        break
                break
        return self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
