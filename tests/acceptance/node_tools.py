"""The npm tools pinned in ``tests/conformance`` (the MCP conformance suite, the MCP Inspector CLI)
and the Node 22 they need, installed there by ``npm ci``: where they are, the ``PATH`` that runs
them, and why they cannot run here. Their tests skip without the install, saying what to run, and
fail instead under ``CI=true``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.acceptance.harness import REPO

SUITE_DIR = REPO / "tests" / "conformance"
BIN = SUITE_DIR / "node_modules" / ".bin"
MIN_NODE_MAJOR = 22


def node_path() -> str:
    """``PATH`` with the pinned ``node`` first: the tools' ``#!/usr/bin/env node`` finds it."""
    return os.pathsep.join([str(BIN), os.environ.get("PATH", "")])


def missing(tool: str, what: str) -> str | None:
    """Why ``tool`` (a file of ``node_modules/.bin``, ``what`` in words) cannot run here, or None."""
    install = f"run `npm ci` in {SUITE_DIR.relative_to(REPO)} (it installs {what} and Node 22)"
    if not (BIN / tool).exists() or not (BIN / "node").exists():
        return f"{what} is not installed: {install}"
    if shutil.which("npx", path=node_path()) is None:
        return "npx is not on PATH (it comes with npm)"
    try:
        version = subprocess.run(
            [str(BIN / "node"), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{BIN / 'node'} does not run ({exc}): {install}"
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match.group(1)) < MIN_NODE_MAJOR:
        return f"{what} needs Node >= {MIN_NODE_MAJOR}, {BIN / 'node'} is {version!r}: {install}"
    return None


def require(tool: str, what: str) -> None:
    """Skip locally, fail under ``CI=true``, when ``tool`` cannot run here."""
    reason = missing(tool, what)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the tests of {what} cannot run: {reason}", pytrace=False)
    pytest.skip(reason)
