"""The run panel: one self-contained HTML page, shown two ways.

* **In an MCP Apps host** (Claude, VS Code, Goose, ...): ``orchestrate_start`` and ``run_status``
  carry ``_meta.ui.resourceUri = ui://construct/run`` (:data:`PANEL_URI`), and the server serves that
  resource (``text/html;profile=mcp-app``) through the SDK's :class:`~mcp.server.apps.Apps`
  extension, which also advertises ``io.modelcontextprotocol/ui`` in the server's capabilities. The
  host renders the page in a sandboxed iframe and talks to it with JSON-RPC over ``postMessage``:
  the page sends ``ui/initialize`` (then ``ui/notifications/initialized``), receives the tool's
  result (``ui/notifications/tool-result``: the run view), and calls tools through the host
  (``tools/call``): ``run_status`` every 2 s while the run has not ended (and with ``task_id`` to
  show one output whole), ``orchestrate_approve`` (with the gate's ``gate_id``) for the approve and
  reject buttons, and revise where the gate's view offers it (``decisions``). The tools answer
  exactly what they answered before: the ``_meta`` entry is the only change, so hosts without Apps
  see no difference.
* **In a browser**, over Streamable HTTP, at ``/runs`` and ``/runs/{run_id}`` (see
  :mod:`server.web.pages`), where it reads JSON endpoints of the same server with ``fetch``.

The page is one file, ``server/web/static/run.html`` (package data), with its style and script inline
and nothing fetched from elsewhere. Which way it runs is the ``data-mode`` attribute of its
``<html>`` element (``app`` as stored, ``web`` when :mod:`server.web.pages` serves it). It carries its own
Content-Security-Policy in a ``<meta>`` element (``default-src 'none'``, the inline script and
style allowed by their SHA-256 hashes only, computed here), which holds inside a host's iframe too;
the web routes also send it, with ``frame-ancestors 'none'``, as an HTTP header. Everything the page
shows from a run — model output above all — is set as text (``textContent``), never parsed as HTML.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from functools import cache
from importlib.resources import files

from mcp.server.apps import Apps
from mcp.server.mcpserver.tools import Tool

#: The panel's resource, named by the tools that show it.
PANEL_URI = "ui://construct/run"
#: The tools whose results the panel renders (a run view each).
PANEL_TOOLS = ("orchestrate_start", "run_status")

_CSP_PLACEHOLDER = "__CSP__"
_MODE_APP = 'data-mode="app"'


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _inline(html: str, tag: str) -> str:
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    if len(found) != 1:  # pragma: no cover - the page is ours; a test pins its shape
        raise ValueError(f"the panel page must have exactly one inline <{tag}>")
    return str(found[0])


@cache
def _template() -> str:
    return files("server.web").joinpath("static/run.html").read_text(encoding="utf-8")


@cache
def content_security_policy() -> str:
    """The page's policy: nothing but its own inline script and style (by hash), and ``fetch`` to
    its own origin (the web page's JSON endpoints; a host's iframe has none to reach)."""
    html = _template()
    return (
        "default-src 'none'; "
        f"script-src {_sha256(_inline(html, 'script'))}; "
        f"style-src {_sha256(_inline(html, 'style'))}; "
        "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'"
    )


@cache
def page(mode: str = "app") -> str:
    """The page, for an MCP Apps host (``app``) or a browser at ``/runs`` (``web``)."""
    if mode not in ("app", "web"):
        raise ValueError(f"unknown panel mode {mode!r}")
    html = _template().replace(_CSP_PLACEHOLDER, content_security_policy(), 1)
    return html.replace(_MODE_APP, f'data-mode="{mode}"', 1)


def panel_extension(tools: Sequence[Tool]) -> Apps:
    """The MCP Apps extension serving the panel, for ``MCPServer(extensions=[...])``; marks the
    :data:`PANEL_TOOLS` among ``tools`` as shown by it (``_meta.ui.resourceUri``), in place."""
    apps = Apps()
    apps.add_html_resource(
        PANEL_URI,
        page("app"),
        name="run-panel",
        title="Run panel",
        description="A run's steps, gates (approve / reject / revise), outputs, tokens and timeline, live.",
        prefers_border=True,
    )
    for tool in tools:
        if tool.name in PANEL_TOOLS:
            tool.meta = {**(tool.meta or {}), "ui": {"resourceUri": PANEL_URI}}
    return apps
