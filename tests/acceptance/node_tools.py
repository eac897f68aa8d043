"""The npm tools pinned in ``tests/conformance`` (the MCP conformance suite, the MCP Inspector CLI)
and in ``tests/a2a_js`` (the A2A JavaScript SDK), each project with the Node 22 they need, installed
there by ``npm ci``: where they are, the ``PATH`` that runs them, and why they cannot run here.
Their tests skip without the install, saying what to run, and fail instead under ``CI=true``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.harness import REPO

SUITE_DIR = REPO / "tests" / "conformance"
A2A_JS_DIR = REPO / "tests" / "a2a_js"
MIN_NODE_MAJOR = 22


def node_path(project: Path = SUITE_DIR) -> str:
    """``PATH`` with ``project``'s pinned ``node`` first: the tools' ``#!/usr/bin/env node`` finds it."""
    return os.pathsep.join([str(project / "node_modules" / ".bin"), os.environ.get("PATH", "")])


def missing(tool: str, what: str, project: Path = SUITE_DIR) -> str | None:
    """Why ``tool`` (a file of ``project``'s ``node_modules/.bin``, or a package of its
    ``node_modules``; ``what`` in words) cannot run here, or None."""
    modules = project / "node_modules"
    node = modules / ".bin" / "node"
    install = f"run `npm ci` in {project.relative_to(REPO)} (it installs {what} and Node 22)"
    installed = (modules / ".bin" / tool).exists() or (modules / tool / "package.json").exists()
    if not installed or not node.exists():
        return f"{what} is not installed: {install}"
    if shutil.which("npx", path=node_path(project)) is None:
        return "npx is not on PATH (it comes with npm)"
    try:
        version = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{node} does not run ({exc}): {install}"
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match.group(1)) < MIN_NODE_MAJOR:
        return f"{what} needs Node >= {MIN_NODE_MAJOR}, {node} is {version!r}: {install}"
    return None


def require(tool: str, what: str, project: Path = SUITE_DIR) -> None:
    """Skip locally, fail under ``CI=true``, when ``tool`` cannot run here."""
    reason = missing(tool, what, project)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the tests of {what} cannot run: {reason}", pytrace=False)
    pytest.skip(reason)
