"""A small client of the Chrome DevTools Protocol, to drive the Debian package's headless Chromium
from the tests (nothing is downloaded: Selenium and Playwright bring or fetch their own drivers).

Chromium is started with ``--remote-debugging-pipe``: it reads protocol messages from file
descriptor 3 and writes its own to descriptor 4, each a JSON object ended by a NUL byte. So no
websocket client is needed, and no port is opened. A thread reads the pipe and hands each message
to the event loop; commands are answered by ``id``, events are kept for :meth:`Chromium.event`.

:func:`chromium_path` finds the binary; the tests skip when there is none, except under
``CI=true`` (``.ci/run`` installs it), where a missing browser is a failure.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

#: Upper bound for one protocol command and for waiting on a page condition (never a speed check).
COMMAND_TIMEOUT_SECONDS = 30.0


def chromium_path() -> str:
    """The Chromium binary: ``CONSTRUCT_TEST_CHROMIUM`` when set (and only that), else ``chromium``
    on the PATH, else ``/usr/bin/chromium``. Skips the test when there is none, fails it under
    ``CI=true``."""
    explicit = os.environ.get("CONSTRUCT_TEST_CHROMIUM")
    if explicit:
        found = explicit if os.access(explicit, os.X_OK) else None
    else:
        found = shutil.which("chromium") or shutil.which("chromium-browser")
        if not found and os.access("/usr/bin/chromium", os.X_OK):
            found = "/usr/bin/chromium"
    if found:
        return found
    message = (
        "no Chromium found (the browser tests drive the Debian package: apt-get install -y chromium, "
        "or set CONSTRUCT_TEST_CHROMIUM to a Chromium binary)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


class ProtocolError(Exception):
    """A command the browser answered with an error."""


class Chromium:
    """One headless Chromium process and its protocol pipe. Use :func:`chromium`."""

    def __init__(self, process: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self._process = process
        self._to_browser = to_browser
        self._from_browser = from_browser
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._loop.call_soon_threadsafe(self._closed)
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                self._loop.call_soon_threadsafe(self._received, json.loads(raw))

    def _received(self, message: dict[str, Any]) -> None:
        if "id" in message:
            future = self._answers.pop(message["id"], None)
            if future is not None and not future.done():
                future.set_result(message)
            return
        self.events.append(message)
        self._changed.set()

    def _closed(self) -> None:
        for future in self._answers.values():
            if not future.done():
                future.set_exception(ProtocolError("the browser closed its protocol pipe"))
        self._answers.clear()

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> Any:
        """Send one command (to ``session``, a target attached with ``flatten``) and return its result."""
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._answers[ident] = future
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        answer = await asyncio.wait_for(future, COMMAND_TIMEOUT_SECONDS)
        if "error" in answer:
            raise ProtocolError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def event(
        self,
        method: str,
        where: Callable[[dict[str, Any]], bool] = lambda _p: True,
        start: int = 0,
        bound: float | None = COMMAND_TIMEOUT_SECONDS,
    ) -> tuple[int, dict[str, Any]]:
        """The first event ``method`` at or after index ``start`` of :attr:`events` whose params
        ``where`` accepts, waiting for it if needed: its index and its params."""
        async with asyncio.timeout(bound):
            seen = start
            while True:
                for index in range(seen, len(self.events)):
                    event = self.events[index]
                    if event["method"] == method and where(event.get("params", {})):
                        return index, event.get("params", {})
                seen = len(self.events)
                self._changed.clear()
                await self._changed.wait()

    async def new_page(self, width: int = 1000, height: int = 800) -> Page:
        """A new tab with ``about:blank``, attached (flat), its Page and Runtime domains enabled."""
        target = (await self.send("Target.createTarget", {"url": "about:blank"}))["targetId"]
        session = (await self.send("Target.attachToTarget", {"targetId": target, "flatten": True}))[
            "sessionId"
        ]
        page = Page(self, session, target)
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.send("Browser.close"), 5)
        except (ProtocolError, TimeoutError):
            self._process.kill()
        await asyncio.to_thread(self._process.wait, 30)
        os.close(self._to_browser)
        await asyncio.to_thread(self._reader.join, 10)
        os.close(self._from_browser)


class Page:
    """One tab (or an out-of-process frame) reached through its flat session."""

    def __init__(self, browser: Chromium, session: str, target: str) -> None:
        self.browser = browser
        self.session = session
        self.target = target

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.browser.send(method, params, self.session)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited), or ProtocolError if it threw."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise ProtocolError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str) -> Any:
        """Wait until ``expression``'s value is truthy in Python (checked every 50 ms); that value.
        (A DOM node comes back as ``{}``: test for one with ``!!``.) An expression that throws counts
        as false (the page may be loading). The bound is only a guard against a test hanging."""
        last: Exception | None = None
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_SECONDS):
                while True:
                    try:
                        value = await self.evaluate(expression)
                    except ProtocolError as exc:  # e.g. the page is between two documents
                        last, value = exc, None
                    if value:
                        return value
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"still false: {expression} (last error: {last})") from None

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})
        await self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    async def click_at(self, x: float, y: float) -> None:
        """A real left click (pressed and released) at page coordinates."""
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    async def press(self, key: str, text: str | None = None) -> None:
        """Press and release one key (``Tab``, ``Enter``, ...) in the focused element."""
        codes = {"Tab": 9, "Enter": 13}
        base = {"key": key, "code": key, "windowsVirtualKeyCode": codes.get(key, 0)}
        await self.send(
            "Input.dispatchKeyEvent", {"type": "keyDown", **base, **({"text": text} if text else {})}
        )
        await self.send("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    async def type_text(self, text: str) -> None:
        await self.send("Input.insertText", {"text": text})

    async def screenshot(self, path: Path, height: float | None = None) -> None:
        """A PNG of the viewport (its top ``height`` pixels, when given)."""
        params: dict[str, Any] = {"format": "png"}
        if height is not None:
            width = await self.evaluate("window.innerWidth")
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        data = (await self.send("Page.captureScreenshot", params))["data"]
        await asyncio.to_thread(path.write_bytes, base64.b64decode(data))


def _spawn(command: list[str], pass_fds: tuple[int, ...], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(command, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def _above_nine(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


@asynccontextmanager
async def chromium(log_path: Path) -> AsyncIterator[Chromium]:
    """A headless Chromium for one test (its own profile directory, its output in ``log_path``),
    closed afterwards."""
    binary = chromium_path()
    with tempfile.TemporaryDirectory(prefix="construct-chromium-") as profile:
        commands_read, commands_write = os.pipe()
        events_read, events_write = os.pipe()
        # The child's ends are moved above 9 first, so that putting them at 3 and 4 cannot
        # overwrite one with the other.
        commands_read, events_write = _above_nine(commands_read), _above_nine(events_write)
        flags = [
            "--headless",
            "--no-sandbox",  # the tests may run as root (CI containers)
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--mute-audio",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "about:blank",
        ]
        # Descriptors 3 and 4 are where --remote-debugging-pipe looks; a small Python trampoline
        # puts them there (sh cannot name descriptors above 9) and becomes Chromium.
        trampoline = (
            "import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
            "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])"
        )
        process = await asyncio.to_thread(
            _spawn,
            [sys.executable, "-c", trampoline, str(commands_read), str(events_write), binary, *flags],
            (commands_read, events_write),
            log_path,
        )
        os.close(commands_read)
        os.close(events_write)
        browser = Chromium(process, commands_write, events_read)
        try:
            yield browser
        finally:
            await browser.close()
