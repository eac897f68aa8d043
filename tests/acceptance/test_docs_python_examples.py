"""Every whole ``python`` block of README.md and docs/**/*.md runs (issue 26): as a script in a fresh
interpreter, the way a reader who followed the quick start runs a copied example: with the venv's
Python (``.venv/bin/python example.py``), the venv not activated (its ``bin``, and so its
``construct-mcp``, not on ``PATH``), its working directory an empty temporary one, ``HOME`` and
``CONSTRUCT_HOME`` fresh temporary directories, no provider API key and no other ``CONSTRUCT_*``
variable — and must exit 0 within 60 s. A block that launches ``construct-mcp serve`` over stdio (the README's
host loop) starts a real server that way; ``HOME`` is fresh too because the MCP client passes a
server only a few variables (``HOME`` and ``PATH`` among them, not ``CONSTRUCT_HOME``), so the
server's default home is a fresh one as well.

Blocks marked ``<!-- fragment -->`` only compile (tests/unit/docs/test_examples.py). The runner is
proved on a page of this directory (``docs_samples/host_loop.md``): a host loop that drives the
built-in ``review-loop`` chain through a gate to its end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from docs.fenced_blocks import Block, all_blocks, blocks_in
from docs.run_quickstart import API_KEYS, reader_environment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).resolve().parent / "docs_samples"
TIMEOUT_SECONDS = 60.0


def _scripts(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.lang == "python" and b.marker is None]


def example_env(tmp_path: Path) -> dict[str, str]:
    """A reader's environment (no API key, no construct-mcp setting) with fresh homes."""
    home = tmp_path / "home"
    home.mkdir()
    env = reader_environment(os.environ, home / ".construct")
    env["HOME"] = str(home)
    venv_bin = Path(sys.executable).parent
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != venv_bin)
    env.pop("VIRTUAL_ENV", None)
    return env


def run_example(block: Block, tmp_path: Path, timeout: float = TIMEOUT_SECONDS) -> str:
    """Run ``block`` as a script (see the module docstring) and return its stdout; fail with its
    output unless it exits 0 within ``timeout`` seconds."""
    work = tmp_path / "cwd"
    work.mkdir(parents=True)
    script = tmp_path / "example.py"
    script.write_text(block.text, "utf-8")
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=work,
        env=example_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a server it started goes with it on a timeout
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{block.where}: still running after {timeout:.0f} s\n{_output(stdout, stderr)}")
    assert process.returncode == 0, f"{block.where}: exited {process.returncode}\n{_output(stdout, stderr)}"
    return stdout


def _output(stdout: str, stderr: str) -> str:
    return f"--- stdout\n{stdout[-6000:]}\n--- stderr\n{stderr[-6000:]}"


DOC_SCRIPTS = _scripts(all_blocks(ROOT))


@pytest.mark.parametrize("block", DOC_SCRIPTS, ids=[b.where for b in DOC_SCRIPTS])
def test_every_python_example_runs(tmp_path: Path, block: Block) -> None:
    run_example(block, tmp_path)


def _sample(name: str) -> list[Block]:
    path = SAMPLES / name
    return blocks_in(path.read_text("utf-8"), path.name)


def test_a_host_loop_over_stdio_runs_a_built_in_chain_to_its_end(tmp_path: Path) -> None:
    (loop,) = _scripts(_sample("host_loop.md"))
    printed = run_example(loop, tmp_path).splitlines()
    assert printed[-1].startswith("run ") and printed[-1].endswith(" completed"), printed
    assert "awaiting_approval -> approve" in printed  # it went through the gate
    # The server ran on the fresh home: its store holds that run.
    run_id = printed[-1].split()[1]
    assert any(run_id in str(p) for p in (tmp_path / "home" / ".construct").rglob("*")), run_id


def test_the_sample_page_has_a_fragment_the_runner_leaves_alone() -> None:
    blocks = _sample("host_loop.md")
    assert [b.marker for b in blocks if b.lang == "python"] == [None, "fragment"]
    assert len(_scripts(blocks)) == 1


def test_a_failing_or_hanging_example_fails_with_its_output(tmp_path: Path) -> None:
    failing = Block("sample.md", 3, "python", "import sys\nprint('about to fail')\nsys.exit(3)\n")
    with pytest.raises(AssertionError, match=r"(?s)sample.md:3: exited 3.*about to fail"):
        run_example(failing, tmp_path / "a")
    hanging = Block("sample.md", 7, "python", "import time\nprint('working', flush=True)\ntime.sleep(30)\n")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)sample.md:7: still running after 2 s.*working"):
        run_example(hanging, tmp_path / "b", timeout=2)


def test_an_example_sees_no_api_key_and_fresh_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in API_KEYS:
        monkeypatch.setenv(variable, "sk-should-not-be-seen")
    monkeypatch.setenv("CONSTRUCT_WORKER_BACKEND", "provider")
    probe = Block(
        "sample.md",
        1,
        "python",
        "import os, pathlib, shutil, sys\n"
        f"assert not any(k in os.environ for k in {sorted(API_KEYS)!r}), 'a key leaked'\n"
        "assert 'CONSTRUCT_WORKER_BACKEND' not in os.environ\n"
        "home = pathlib.Path(os.environ['CONSTRUCT_HOME'])\n"
        "assert not home.exists() and home.parent == pathlib.Path(os.environ['HOME'])\n"
        "assert pathlib.Path.cwd().name == 'cwd' and not any(pathlib.Path.cwd().iterdir())\n"
        "assert os.path.dirname(sys.executable) not in os.environ['PATH'].split(os.pathsep)\n"
        "assert 'VIRTUAL_ENV' not in os.environ\n",
    )
    run_example(probe, tmp_path)


def test_an_example_that_needs_the_venv_activated_fails_as_it_does_for_a_reader(tmp_path: Path) -> None:
    # The README's host loop once started command="construct-mcp": found only with the venv
    # activated, which the quick start does not do.
    by_path = Block(
        "sample.md",
        1,
        "python",
        "import asyncio\n"
        "from mcp import Client, StdioServerParameters\n"
        "async def main() -> None:\n"
        "    async with Client(StdioServerParameters(command='construct-mcp', args=['serve'])):\n"
        "        pass\n"
        "asyncio.run(main())\n",
    )
    with pytest.raises(AssertionError, match=r"(?s)sample.md:1: exited 1.*construct-mcp"):
        run_example(by_path, tmp_path)
