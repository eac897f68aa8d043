"""Make the pictures of the run page and the run panel: ``python scripts/screenshots.py``.

A real server (``construct-mcp serve --transport streamable-http``, a subprocess with a fresh home
and named tokens) runs the built-in ``review-loop`` chain (architect → engineer → reviewer, the
reviewer's typed verdict routing back to the engineer) on a small request, with a gate before the
engineer. The script plays the host: it hands in the outputs a host's model would write
(:data:`OUTPUTS`), through the official MCP client, as any host does. Headless Chromium (the Debian
package, driven over the DevTools protocol by :mod:`tests.browser.cdp`, as the browser tests do)
takes the pictures:

* ``run-page.png``: the run page (``/runs/<id>``), signed in as an approver, at the gate before the
  engineer, the architect's plan open. The approver then approves there, with a comment.
* ``run-panel.png``: the run panel (the ``ui://construct/run`` resource) rendered by a host page in
  a sandboxed iframe that speaks the MCP Apps bridge (:mod:`tests.browser.apps_host`, framed
  neutrally), once the run completed: the gate approved, one revision asked by the reviewer, the
  reviewer's final verdict open.
* ``run-page-streaming.png`` (unless ``--no-streaming``): the run page of the ``default`` chain on
  the provider backend, while the engineer's provider call streams: its text growing in place. The
  provider is the fake one the streaming tests use (:mod:`tests.fakes.fake_provider`), a real HTTP
  server speaking the Anthropic Messages API, so no key is needed and nothing leaves the machine.

The pictures go to ``docs/images/`` (``--out`` to choose). The script runs in the project's
environment with the ``test`` extra (the DevTools client lives with the browser tests:
``.venv/bin/python scripts/screenshots.py``) and needs Chromium (``apt-get install -y chromium``, or
``CONSTRUCT_TEST_CHROMIUM``). It takes about a minute. ``tests/browser/test_screenshots.py`` runs it
into a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file: the checkout's tests package holds the browser client
    sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
import pytest  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client import advertise  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID  # noqa: E402
from mcp.types import TextResourceContents  # noqa: E402

from server.web.panel import PANEL_URI  # noqa: E402
from tests.acceptance.test_mcp_http import http_server  # noqa: E402
from tests.browser.apps_host import NEUTRAL_HOST_PAGE, AppsHost  # noqa: E402
from tests.browser.cdp import Chromium, Page, chromium, chromium_path  # noqa: E402
from tests.browser.test_run_pages import click, log_in  # noqa: E402
from tests.fakes.fake_provider import FakeProvider  # noqa: E402

#: Where the pictures go by default.
OUT = REPO / "docs" / "images"
#: The browser window of the run pages (CSS pixels, device scale 1): as wide as the page's column.
#: A picture is cut below the run's tasks, at most this high.
WIDTH, HEIGHT = 1000, 1100
#: The host window around the panel: narrower, as a host's side panel or chat column is.
PANEL_WIDTH, PANEL_HEIGHT = 820, 1100

REQUEST = "Add a --json flag to `todo list`, so that scripts can read the list without parsing the table."
CHAIN = "review-loop"
#: The two people: the developer whose host runs the chain, and the lead who approves the plan.
SAM = "sam-token-" + "4f0c9a2e7d1b3865"
MARIA = "maria-token-" + "b81d3e6a0c5f2947"
CONFIG = f"""
[tokens.sam]
token = "{SAM}"
roles = ["read", "operate"]

[tokens.maria]
token = "{MARIA}"
roles = ["read", "approve"]
"""
COMMENT = "Plan looks right. Keep the field names stable: scripts will depend on them."
#: Her comment at the gate before the engineer's second round (after the reviewer's notes).
SECOND_COMMENT = "Fix both review points, nothing else."

PLAN = """\
## Summary
`todo list` prints a table for people. Add `--json`, which prints the same items as one JSON array on
stdout, for scripts. The table stays the default; both outputs come from the same query.

## Requirements and assumptions
- `todo list --json` prints `[{"id": 3, "title": "Renew passport", "done": false, "due": "2026-12-04"}]`
  and a newline; nothing else on stdout.
- The filters (`--done`, `--due-before`) apply to both outputs.
- ASSUMPTION: dates are ISO 8601 strings, `null` when unset.
- Non-goal: JSON output for the other commands (a follow-up).

## Design
- `todo/cli.py`: a `--json` flag on the `list` subparser; `cmd_list` picks the renderer.
- `todo/render.py`: `items_json(items: list[Item]) -> str` beside the existing `items_table`.
- Errors still go to stderr with exit code 1, so stdout holds only the array.

## Alternatives considered
- `--format table|json`: more general, but one flag is what was asked; `--format` can alias it later.

## Risks and open questions
- Scripts will rely on the field names: list them in `--help` and pin them with a test.

## Build plan
1. `items_json` with a unit test of its exact output (empty list, a unicode title, no due date).
2. The flag in `cli.py`; a CLI test that `todo list --json` parses as JSON.
3. One example in the README.

## Disagreements with upstream
None.
"""

PATCH = """\
## Summary
`todo list --json` prints the filtered items as one JSON array; the table is unchanged.

## Changes
`todo/render.py`
```python
def items_json(items: list[Item]) -> str:
    return json.dumps([item.as_dict() for item in items], ensure_ascii=False)
```
`todo/cli.py`
```python
listing.add_argument("--json", action="store_true", help="print the items as a JSON array")
...
print(items_json(items) if args.json else items_table(items))
```

## Tests
`tests/test_render.py::test_items_json` (empty list, unicode title); `pytest tests/test_render.py`

## How to verify
`todo list --json | python -m json.tool`

## Deviations from upstream
None.

## Known limitations and follow-ups
None.
"""

REVISION = """\
## Summary
Due dates are written as ISO 8601 strings (`null` when unset); the CLI test the plan asked for is added.

## Changes
`todo/render.py`
```python
def items_json(items: list[Item]) -> str:
    rows = [{**item.as_dict(), "due": item.due.isoformat() if item.due else None} for item in items]
    return json.dumps(rows, ensure_ascii=False)
```
`tests/test_cli.py`
```python
def test_list_json_parses(cli: CliRunner) -> None:
    result = cli.invoke(["list", "--json"])
    assert json.loads(result.stdout)[0].keys() == {"id", "title", "done", "due"}
```

## Tests
`pytest tests/test_render.py tests/test_cli.py`

## How to verify
`todo add "Renew passport" --due 2026-12-04 && todo list --json`

## Deviations from upstream
None.

## Review points addressed
1. Due dates: converted with `isoformat()`, `None` stays `null`; covered in `test_items_json`.
2. The CLI test: `test_list_json_parses`.
"""

FIRST_REVIEW = {
    "verdict": "revise",
    "notes": "1. major - todo/render.py, items_json: as_dict() returns `due` as a date, which json.dumps "
    "cannot serialise, so `todo list --json` fails for any item with a due date. Write it with "
    ".isoformat() (None stays null) and add that case to the test.\n"
    "2. minor - the CLI test of the plan's step 2 is missing.",
}
FINAL_REVIEW = {
    "verdict": "approve",
    "notes": "Both points are addressed: due dates are ISO strings or null, and the CLI test parses the "
    "output. nit - the README example of step 3 is still to come.",
}

#: What the host's model hands in for each task, in the order the chain asks for them.
OUTPUTS: tuple[tuple[str, str], ...] = (
    ("architect", PLAN),
    ("engineer", PATCH),
    ("reviewer", json.dumps(FIRST_REVIEW, indent=2)),
    ("engineer", REVISION),
    ("reviewer", json.dumps(FINAL_REVIEW, indent=2)),
)
#: The usage a host reports with each output (its own model's tokens), in the same order.
USAGE: tuple[tuple[int, int], ...] = ((1840, 612), (3120, 455), (3905, 238), (4410, 530), (4980, 121))
#: The host's model takes this long per task (the run's timeline shows these gaps).
THINKING_SECONDS = 1.5

#: What the streamed picture's provider writes: the architect's plan after 2 s, the engineer's
#: patch slowly (12 characters every 50 ms; the picture is taken while it is written).
STREAMED = {
    "architect": [{"text": PLAN, "delay_seconds": 2, "input_tokens": 1840, "output_tokens": 612}],
    "engineer": [{"text": PATCH, "chunk_chars": 12, "chunk_delay_seconds": 0.05, "input_tokens": 3120}],
    "reviewer": [{"text": "## Summary\nLooks right.\n\nVERDICT: approve"}],
}

#: Where the run's tasks end, in CSS pixels (a picture is cut there, with a margin).
TASKS_BOTTOM = "Math.ceil(document.getElementById('tasks').getBoundingClientRect().bottom) + 14"


@dataclass(frozen=True)
class Picture:
    """A picture written, with what its documents held when it was taken."""

    path: Path
    #: the visible text: the page's title and body (and the panel frame's, for the panel)
    text: str
    #: the markup of the same documents
    html: str


def png_size(data: bytes) -> tuple[int, int]:
    """A PNG's width and height in pixels (its IHDR chunk); ValueError if it is no PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


async def _contents(page: Page) -> tuple[str, str]:
    text = await page.evaluate("document.title + '\\n' + document.body.innerText")
    html = await page.evaluate("document.documentElement.outerHTML")
    return str(text), str(html)


#: Resolves once the document has painted what it holds now (two animation frames later).
PAINTED = "new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"
#: A picture of a still page is taken until two in a row are the same, at most this many times.
MAX_CAPTURES = 20


async def _capture(
    page: Page, path: Path, height: float, *, frames: Sequence[Page] = (), still: bool = True
) -> None:
    """The top ``height`` CSS pixels of ``page``'s viewport as a PNG, once it and its ``frames``
    (out-of-process iframes, painted apart) have painted; for a ``still`` page, once two
    pictures in a row are the same (a frame's new content can reach the page's picture late)."""
    await page.evaluate("document.activeElement && document.activeElement.blur()")
    width = await page.evaluate("window.innerWidth")
    clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
    previous = b""
    for _ in range(MAX_CAPTURES):
        for document in (*frames, page):
            await document.wait_for(PAINTED)
        data = base64.b64decode(
            (await page.send("Page.captureScreenshot", {"format": "png", "clip": clip}))["data"]
        )
        if not still or data == previous:
            break
        previous = data
        await asyncio.sleep(0.2)
    else:
        raise RuntimeError(f"{path.name}: the page kept changing; no still picture")
    await asyncio.to_thread(path.write_bytes, data)


async def _open_page(browser: Chromium, width: int, height: int) -> Page:
    page = await browser.new_page(width, height)
    await _neutral(page)
    return page


async def _neutral(page: Page) -> None:
    """The light theme (whatever the machine prefers) and no scroll bars, in a page or a frame."""
    await page.send(
        "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "light"}]}
    )
    await page.send("Emulation.setScrollbarsHidden", {"hidden": True})


@asynccontextmanager
async def _identity(port: int, token: str, **client_kwargs: Any) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as authed,
        Client(
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=authed), **client_kwargs
        ) as client,
    ):
        yield client


async def _tool(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{name} failed: {result.content}")
    return dict(result.structured_content)


async def _needed(client: Client, view: dict[str, Any]) -> dict[str, Any]:
    """The run once it needs its host (or ended): ``run_status`` as its ``wait`` actions say."""
    while view["next_action"]["kind"] == "wait":
        view = await _tool(client, "run_status", view["next_action"]["arguments"])
    return view


async def _hand_in(client: Client, view: dict[str, Any], index: int) -> dict[str, Any]:
    """The host's turn: the model's answer to the task the run waits for (``OUTPUTS[index]``)."""
    view = await _needed(client, view)
    action = view["next_action"]
    step, output = OUTPUTS[index]
    if action["kind"] != "run_host_task" or action["specialist"] != step:
        raise RuntimeError(f"expected the host task {step}, the run asks for {action}")
    await asyncio.sleep(THINKING_SECONDS)
    input_tokens, output_tokens = USAGE[index]
    resumed = await _tool(
        client,
        "orchestrate_resume",
        {
            "run_id": view["run_id"],
            "task_id": action["task_id"],
            "output": output,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        },
    )
    return await _needed(client, resumed)


async def _run_page(browser: Chromium, port: int, sam: Client, out: Path) -> tuple[str, Picture]:
    """Start the run, hand in the plan, picture the page at the gate, approve there."""
    view = await _tool(
        sam,
        "orchestrate_start",
        {"request": REQUEST, "chain": CHAIN, "approve_before": ["engineer"]},
    )
    run_id = str(view["run_id"])
    view = await _hand_in(sam, view, 0)
    if view["next_action"]["kind"] != "approve":
        raise RuntimeError(f"expected the gate before the engineer, the run asks for {view['next_action']}")
    page = await _open_page(browser, WIDTH, HEIGHT)
    await page.navigate(f"http://127.0.0.1:{port}/runs/{run_id}")
    await log_in(page, MARIA)
    await page.wait_for("!!document.querySelector('button.approve')")
    await click(page, "#tasks details summary")  # the architect's plan, open and whole
    await page.wait_for("!!document.querySelector(\"button[data-key='full:architect']\")")
    await click(page, "button[data-key='full:architect']")
    await page.wait_for(
        "!document.querySelector(\"button[data-key='full:architect']\")"
        " && !!document.querySelector(\"pre[data-task='architect']\")"
    )
    await page.evaluate("document.querySelector(\"pre[data-task='architect']\").scrollTop = 0")
    await page.evaluate("window.scrollTo(0, 0)")  # (a click scrolls its target to the middle)
    path = out / "run-page.png"
    await _capture(page, path, min(await page.evaluate(TASKS_BOTTOM), HEIGHT))
    text, html = await _contents(page)

    # The lead approves on the page, with a comment (a real click).
    await page.evaluate("document.querySelector('#gates textarea').focus()")
    await page.type_text(COMMENT)
    await click(page, "button.approve")
    await page.wait_for("document.getElementById('gates').textContent.includes('approved by maria')")
    return run_id, Picture(path, text, html)


async def _run_panel(browser: Chromium, sam: Client, maria: Client, run_id: str, out: Path) -> Picture:
    """Play the rest of the chain as the host (the lead approves the engineer's second round from
    her own host), then picture the panel of the completed run."""
    view = await _tool(sam, "run_status", {"run_id": run_id})
    for index in range(1, len(OUTPUTS)):
        view = await _needed(sam, view)
        if view["next_action"]["kind"] == "approve":
            arguments = {**view["next_action"]["arguments"], "comment": SECOND_COMMENT}
            view = await _needed(sam, await _tool(maria, "orchestrate_approve", arguments))
        view = await _hand_in(sam, view, index)
    if view["status"] != "completed":
        raise RuntimeError(f"expected the run to complete, it is {view['status']}")
    contents = (await sam.read_resource(PANEL_URI)).contents[0]
    if not isinstance(contents, TextResourceContents) or contents.mime_type != APP_MIME_TYPE:
        raise RuntimeError(f"the server's {PANEL_URI} is not an MCP App: {contents}")
    shown = await sam.call_tool("run_status", {"run_id": run_id})
    page = await _open_page(browser, PANEL_WIDTH, PANEL_HEIGHT)
    host = AppsHost(
        page, sam, {"run_id": run_id}, shown, host_page=NEUTRAL_HOST_PAGE, host_name="construct-mcp"
    )
    frame = await host.open(contents.text)
    await _neutral(frame)
    bridge = asyncio.create_task(host.serve())
    try:
        await frame.wait_for("document.getElementById('status').textContent === 'completed'")
        # The reviewer's final verdict, open.
        await frame.evaluate("document.querySelector('#tasks > li:last-child details').open = true")
        await frame.wait_for("!!document.querySelector('#tasks > li:last-child pre.out')")
        await page.evaluate("window.scrollTo(0, 0)")
        # The host gave the frame the height the panel asked for: cut below the tasks.
        top = await page.evaluate("document.getElementById('panel').getBoundingClientRect().top")
        await page.wait_for(f"document.getElementById('panel').offsetHeight > {PANEL_HEIGHT} - {top}")
        path = out / "run-panel.png"
        await _capture(
            page, path, min(top + await frame.evaluate(TASKS_BOTTOM), PANEL_HEIGHT), frames=[frame]
        )
        page_text, page_html = await _contents(page)
        frame_text, frame_html = await _contents(frame)
    finally:
        bridge.cancel()
        with suppress(asyncio.CancelledError):
            await bridge
    return Picture(path, page_text + "\n" + frame_text, page_html + "\n" + frame_html)


async def _streaming_page(browser: Chromium, home: Path, out: Path) -> Picture:
    """The ``default`` chain on the provider backend (the fake provider; the server's home is
    ``home``): the page while the engineer's call streams."""
    with FakeProvider(STREAMED) as fake:
        env = {
            "CONSTRUCT_WORKER_BACKEND": "provider",
            "CONSTRUCT_MODEL": "claude-sonnet-4-5",
            "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-" + "screenshots-fake-provider",
        }
        async with (
            http_server(home, "streamable-http", **env) as port,
            httpx2.AsyncClient(timeout=30) as http,
            Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client,
        ):
            view = await _tool(client, "orchestrate_start", {"request": REQUEST, "wait_seconds": 0})
            page = await _open_page(browser, WIDTH, HEIGHT)
            await page.navigate(f"http://127.0.0.1:{port}/runs/{view['run_id']}")
            live = "document.querySelector('pre[data-live=\"engineer\"]')"
            await page.wait_for(f"{live} && {live}.textContent.length > 420")
            path = out / "run-page-streaming.png"
            # The text grows while the picture is taken: no waiting for two alike.
            await _capture(page, path, min(await page.evaluate(TASKS_BOTTOM), HEIGHT), still=False)
            text, html = await _contents(page)
            # Let the chain finish, so the server stops with nothing in flight.
            deadline = time.monotonic() + 60
            while view["status"] != "completed" and time.monotonic() < deadline:
                view = await _tool(client, "run_status", {"run_id": view["run_id"], "wait_seconds": 5})
    return Picture(path, text, html)


def _prepare(out: Path, work: Path) -> tuple[Path, Path]:
    """The folders: ``out``, and the two servers' homes in ``work`` (the first with its tokens)."""
    out.mkdir(parents=True, exist_ok=True)
    home, streaming_home = work / "home", work / "streaming"
    home.mkdir()
    streaming_home.mkdir()
    (home / "construct.toml").write_text(CONFIG)
    return home, streaming_home


async def generate(out: Path, work: Path, *, streaming: bool = True) -> list[Picture]:
    """Write the pictures into ``out`` (created if needed); ``work`` holds the servers' homes and
    logs. The pictures, in the order written."""
    home, streaming_home = await asyncio.to_thread(_prepare, out, work)
    apps = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})
    async with (
        chromium(work / "chromium.log") as browser,
        http_server(home, "streamable-http") as port,
        _identity(port, SAM, extensions=[apps]) as sam,
        _identity(port, MARIA) as maria,
    ):
        run_id, page = await _run_page(browser, port, sam, out)
        pictures = [page, await _run_panel(browser, sam, maria, run_id, out)]
        if streaming:
            pictures.append(await _streaming_page(browser, streaming_home, out))
    return pictures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the pictures go (default: {OUT})")
    parser.add_argument("--no-streaming", action="store_true", help="skip run-page-streaming.png")
    args = parser.parse_args(argv)
    try:
        chromium_path()
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:
        print(f"screenshots: {exc}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="construct-screenshots-") as work:
        pictures = asyncio.run(generate(args.out, Path(work), streaming=not args.no_streaming))
    for picture in pictures:
        data = picture.path.read_bytes()
        width, height = png_size(data)
        print(f"{picture.path}: {width}x{height}, {len(data) // 1024} KB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
