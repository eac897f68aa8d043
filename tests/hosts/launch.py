"""Run one host CLI headless against the scripted model, configured as docs/hosts.md says.

Each host's configuration is the block marked ``<!-- host-config: NAME -->`` in ``docs/hosts.md``,
with the page's placeholder paths replaced (the venv's ``construct-mcp``, a temporary
``CONSTRUCT_HOME``); only what points the host at the scripted model (its model provider, API key,
``HOME``) is the test's own. A run is bounded: on timeout its whole process group is killed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "tests" / "hosts" / "node_modules" / ".bin"
HOSTS = ("claude", "codex", "gemini", "opencode")
DOC_EXE = "/absolute/path/to/construct-mcp/.venv/bin/construct-mcp"
DOC_HOME = "/Users/you/.construct"


def server_exe() -> Path:
    """The ``construct-mcp`` of this checkout's venv (what the page tells a person to use)."""
    return REPO / ".venv" / "bin" / "construct-mcp"


def doc_block(host: str) -> str:
    """The configuration block docs/hosts.md shows for ``host``."""
    page = (REPO / "docs" / "hosts.md").read_text(encoding="utf-8")
    # (a TOML block not for construct.toml also carries docs/fenced_blocks.py's fragment marker)
    found = re.search(
        rf"<!-- host-config: {host} -->\n(?:<!-- fragment -->\n)?```\w*\n(.*?)\n```", page, re.DOTALL
    )
    assert found is not None, f"docs/hosts.md has no host-config block for {host}"
    return found.group(1)


def missing(host: str) -> str | None:
    """Why ``host`` cannot run here, or None."""
    if not (BIN / host).exists():
        return f"{BIN / host} is missing: run `npm ci` in tests/hosts"
    if not server_exe().exists():
        return f"{server_exe()} is missing: install the project in .venv"
    return None


@dataclass
class Outcome:
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str


def run_host(host: str, base_url: str, chain: str, root: Path, home: Path, timeout: float) -> Outcome:
    """Run ``host`` on ``chain`` ('Build a URL shortener') with its model at ``base_url``; ``root``:
    a fresh directory (its HOME and working directory), ``home``: the CONSTRUCT_HOME."""
    exe = str(server_exe())
    user = root / "user"
    user.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(user), "TERM": "dumb"}
    prompt = f"Use construct: start the {chain} chain on 'Build a URL shortener'"
    block = doc_block(host)
    if host == "claude":
        env |= {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "sk-scripted",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        commands = []
        for line in block.splitlines():
            line = line.replace("$HOME/.construct", str(home)).replace(DOC_EXE, exe)
            line = line.replace("/mcp__construct__default", f"/mcp__construct__{chain}")
            words = shlex.split(line)
            extra = {}
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                name, _, value = words.pop(0).partition("=")
                extra[name] = value
            assert words[0] == "claude", line
            commands.append(([str(BIN / "claude"), *words[1:]], extra))
        for command, extra in commands[:-1]:
            subprocess.run(command, env=env | extra, cwd=root, check=True, capture_output=True, timeout=60)
        command, extra = commands[-1]
        env |= extra
        command += ["--output-format", "stream-json", "--verbose"]
    elif host == "codex":
        codex_home = user / ".codex"
        codex_home.mkdir()
        provider = (
            'model_provider = "scripted"\nmodel = "scripted-1"\n\n[model_providers.scripted]\n'
            f'name = "scripted"\nbase_url = "{base_url}/v1"\nenv_key = "SCRIPTED_API_KEY"\n'
            'wire_api = "responses"\n\n'
        )
        config = block.replace(DOC_EXE, exe).replace(DOC_HOME, str(home))
        (codex_home / "config.toml").write_text(provider + config + "\n", encoding="utf-8")
        env |= {"CODEX_HOME": str(codex_home), "SCRIPTED_API_KEY": "sk-scripted"}
        command = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--json", "-C", str(root), prompt]
    elif host == "gemini":
        settings = json.loads(block.replace(DOC_EXE, exe).replace(DOC_HOME, str(home)))
        settings["security"] = {"auth": {"selectedType": "gemini-api-key"}}
        (user / ".gemini").mkdir()
        (user / ".gemini" / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
        env |= {
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_API_KEY": "scripted-key",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }
        command = [str(BIN / "gemini"), "-p", prompt, "--output-format", "stream-json"]
    else:
        config = json.loads(block.replace(DOC_EXE, exe).replace(DOC_HOME, str(home)))
        config["provider"] = {
            "scripted": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Scripted",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "sk-scripted"},
                "models": {"scripted-1": {"name": "Scripted 1"}},
            }
        }
        path = root / "opencode.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        env |= {
            "OPENCODE_CONFIG": str(path),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        }
        command = [str(BIN / "opencode"), "run", "--format", "json", "-m", "scripted/scripted-1", prompt]
    return _bounded(command, env, root, timeout)


def _bounded(command: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Outcome:
    started = time.monotonic()
    with subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
            code: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            code = None
    return Outcome(code, time.monotonic() - started, out, err)
