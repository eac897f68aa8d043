"""A test MCP Apps host: a page in headless Chromium that renders a tool's UI resource in a
sandboxed iframe (as Claude, VS Code or Goose do) and speaks the Apps bridge with it — JSON-RPC over
``postMessage``: it answers ``ui/initialize``, sends the tool's input and result once the panel says
``ui/notifications/initialized``, and forwards the panel's ``tools/call`` requests to the MCP server
through a real :class:`mcp.Client`.

The page only relays: each message the panel posts reaches the test through a DevTools binding
(``toHost``), and the test's answers go back with ``toPanel``. The panel's iframe has an opaque
origin (``sandbox="allow-scripts"``, no ``allow-same-origin``), so the host page cannot reach into
it; the test reads it through its own DevTools session (Chromium runs such a frame out of process).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mcp import Client
from mcp.types import CallToolResult

from tests.browser.cdp import Chromium, Page

#: The relay both host pages end with: the panel's messages to the test, the test's to the panel.
BRIDGE = """
  window.addEventListener('message', (ev) => {
    if (ev.source === frame.contentWindow) toHost(JSON.stringify(ev.data));
  });
  window.toPanel = (message) => frame.contentWindow.postMessage(message, '*');
  window.loadPanel = (html) => { frame.srcdoc = html; };
})()
"""

HOST_PAGE = (
    """
(() => {
  document.title = 'Test MCP Apps host';
  const bar = document.createElement('div');
  bar.textContent = 'Test MCP Apps host: the panel below is a sandboxed iframe';
  bar.style.cssText = 'font:12px system-ui;padding:4px 8px;background:#e8ecf1;color:#333';
  const frame = document.createElement('iframe');
  frame.id = 'panel';
  frame.sandbox = 'allow-scripts';
  frame.style.cssText = 'border:0;width:100%;height:calc(100vh - 24px);display:block';
  document.body.style.margin = '0';
  document.body.append(bar, frame);
"""
    + BRIDGE
)

#: A host page with nothing of its own to read: the panel's iframe on a plain background, framed as
#: a host frames an app (for pictures of the panel).
NEUTRAL_HOST_PAGE = (
    """
(() => {
  document.title = 'construct-mcp';
  const frame = document.createElement('iframe');
  frame.id = 'panel';
  frame.sandbox = 'allow-scripts';
  frame.style.cssText = 'border:1px solid #d5dae0;border-radius:10px;background:#fff;display:block;'
    + 'width:calc(100% - 34px);height:calc(100vh - 34px);margin:16px';
  document.body.style.cssText = 'margin:0;background:#eef1f4';
  document.body.append(frame);
  // As hosts do, the frame takes the height the panel asks for (it reports its content's size).
  window.addEventListener('message', (ev) => {
    const m = ev.data;
    if (ev.source === frame.contentWindow && m && m.method === 'ui/notifications/size-changed')
      frame.style.height = m.params.height + 'px';
  });
"""
    + BRIDGE
)


class AppsHost:
    """The host side of the bridge for one panel. ``tool_input`` and ``tool_result`` are what the
    host sends the panel after it initialized; :attr:`received` holds every message the panel
    sent, :attr:`calls` the ``tools/call`` params it asked the host to forward. ``host_page`` builds
    the page around the panel (:data:`HOST_PAGE` or :data:`NEUTRAL_HOST_PAGE`); ``host_name`` is the
    host's name in its answer to ``ui/initialize``."""

    def __init__(
        self,
        page: Page,
        client: Client,
        tool_input: dict[str, Any],
        tool_result: CallToolResult,
        *,
        host_page: str = HOST_PAGE,
        host_name: str = "construct-mcp test host",
    ) -> None:
        self.page = page
        self.host_page = host_page
        self.host_name = host_name
        self.client = client
        self.tool_input = tool_input
        self.tool_result = tool_result
        self.received: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def browser(self) -> Chromium:
        return self.page.browser

    async def open(self, html: str) -> Page:
        """Build the host page, load ``html`` into its iframe; the iframe's own session."""
        await self.page.send("Runtime.addBinding", {"name": "toHost"})
        await self.page.send(
            "Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False, "flatten": True}
        )
        start = len(self.browser.events)
        await self.page.evaluate(self.host_page)
        await self.page.evaluate(f"loadPanel({json.dumps(html)})")
        _, attached = await self.browser.event(
            "Target.attachedToTarget", lambda p: p["targetInfo"]["type"] == "iframe", start
        )
        return Page(self.browser, attached["sessionId"], attached["targetInfo"]["targetId"])

    async def serve(self) -> None:
        """Answer the panel's messages until cancelled."""
        index = 0
        while True:
            index, params = await self.browser.event(
                "Runtime.bindingCalled", lambda p: p["name"] == "toHost", index, bound=None
            )
            index += 1
            message = json.loads(params["payload"])
            self.received.append(message)
            task = asyncio.create_task(self._handle(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method == "ui/initialize":
            await self._reply(
                message,
                {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "hostInfo": {"name": self.host_name, "version": "1"},
                    "hostCapabilities": {"serverTools": {}},
                    "hostContext": {"theme": "light", "displayMode": "inline"},
                },
            )
        elif method == "ui/notifications/initialized":
            await self._notify("ui/notifications/tool-input", {"arguments": self.tool_input})
            await self._notify("ui/notifications/tool-result", _wire(self.tool_result))
        elif method == "tools/call":
            self.calls.append(message["params"])
            result = await self.client.call_tool(message["params"]["name"], message["params"]["arguments"])
            await self._reply(message, _wire(result))
        elif "id" in message:
            await self._send(
                {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no"}}
            )

    async def _reply(self, request: dict[str, Any], result: dict[str, Any]) -> None:
        await self._send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    async def _notify(self, method: str, params: dict[str, Any]) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def _send(self, message: dict[str, Any]) -> None:
        await self.page.evaluate(f"toPanel({json.dumps(message)})")


def _wire(result: CallToolResult) -> dict[str, Any]:
    """A tool result as it travels in JSON-RPC (camelCase)."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


async def click_in_frame(host: Page, frame: Page, selector: str) -> None:
    """A real mouse click on the element ``selector`` of the panel's frame, at its centre."""
    rect = await frame.evaluate(
        f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: 'center'}});
            const r = e.getClientRects()[0]; return [r.x + r.width / 2, r.y + r.height / 2]; }})()"""
    )
    origin = await host.evaluate(
        "(() => { const r = document.getElementById('panel').getBoundingClientRect(); return [r.x, r.y]; })()"
    )
    await host.click_at(origin[0] + rect[0], origin[1] + rect[1])
