"""The run panel as MCP Apps hosts see it: two tools name ``ui://construct/run``, the server serves
that page (``text/html;profile=mcp-app``) and advertises the Apps extension; the page is one small
self-contained file whose inline script and style are the only ones its policy allows, and which
never parses run data as HTML. Clients without Apps get the answers they got before."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from mcp import Client
from mcp.client import advertise
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID
from mcp.types import TextResourceContents

from server.app import ConstructApp
from server.settings.config import load_settings
from server.web.panel import PANEL_TOOLS, PANEL_URI, content_security_policy, page

APPS = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})


def _app(tmp_path: Path) -> ConstructApp:
    return ConstructApp(load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1"}))


async def test_two_tools_name_the_panel_and_the_server_serves_it(tmp_path: Path) -> None:
    async with Client(_app(tmp_path).build_server(), extensions=[APPS]) as client:
        assert EXTENSION_ID in (client.server_capabilities.extensions or {})
        tools = (await client.list_tools()).tools
        shown = {t.name for t in tools if (t.meta or {}).get("ui", {}).get("resourceUri") == PANEL_URI}
        assert shown == set(PANEL_TOOLS) == {"orchestrate_start", "run_status"}
        contents = (await client.read_resource(PANEL_URI)).contents
        assert len(contents) == 1 and isinstance(contents[0], TextResourceContents)
        assert contents[0].mime_type == APP_MIME_TYPE
        assert contents[0].text == page("app")
        assert 'data-mode="app"' in contents[0].text


def _inline(html: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_the_page_is_small_self_contained_and_allows_only_its_own_script_and_style() -> None:
    for mode in ("app", "web"):
        html = page(mode)
        assert len(html.encode()) < 40_000
        assert f'data-mode="{mode}"' in html
        # Nothing fetched from elsewhere: no URLs, no external scripts, styles, fonts or images.
        for needle in ("http://", "https://", "//cdn", "<link", "@import", "url(", "<img", " src="):
            assert needle not in html, needle
        (script,) = _inline(html, "script")
        (style,) = _inline(html, "style")
        policy = content_security_policy()
        assert f'content="{policy}"' in html  # the page carries its own policy
        assert f"script-src '{_sha256(script)}';" in policy
        assert f"style-src '{_sha256(style)}';" in policy
        assert policy.startswith("default-src 'none';") and "'unsafe-inline'" not in policy
        # No inline event handlers or style attributes: the policy would block them anyway.
        assert not re.search(r"<[^>]+\s(on\w+|style)=", html)


def test_the_script_never_turns_data_into_html() -> None:
    (script,) = _inline(page("web"), "script")
    script = re.sub(r"^\s*//.*$", "", script, flags=re.MULTILINE)  # the comments may name them
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("):
        assert sink not in script, sink
    assert "textContent" in script


async def test_hosts_without_apps_get_the_same_answers(tmp_path: Path) -> None:
    server = _app(tmp_path).build_server()
    async with Client(server, extensions=[APPS]) as with_apps, Client(server) as without:
        started = await without.call_tool(
            "orchestrate_start", {"request": "same answers", "chain": ["writer"], "wait_seconds": 5}
        )
        run_id = (started.structured_content or {})["run_id"]
        a = await with_apps.call_tool("run_status", {"run_id": run_id})
        b = await without.call_tool("run_status", {"run_id": run_id})
        assert a.structured_content == b.structured_content
        assert a.content == b.content
        assert a.meta == b.meta
