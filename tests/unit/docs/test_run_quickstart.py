"""docs/run_quickstart.py, the CI step that runs the README's quick start as a newcomer would: which
block it takes, how its ``git clone`` becomes a clone of the checkout, and that a failing command,
a hang or a missing block fails it (on tiny repositories made here; CI runs the real one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from docs.run_quickstart import (
    EXIT_NOT_RUN,
    EXIT_TIMEOUT,
    QuickstartError,
    clone_directory,
    main,
    quickstart_script,
    reader_environment,
    run,
    with_local_clone,
)


@pytest.mark.parametrize(
    ("url", "directory"),
    [
        ("https://github.com/someone/construct-mcp.git", "construct-mcp"),
        ("https://github.com/someone/construct-mcp", "construct-mcp"),
        ("https://github.com/someone/construct-mcp/", "construct-mcp"),
        ("git@github.com:someone/construct-mcp.git", "construct-mcp"),
    ],
)
def test_the_clone_keeps_the_directory_name_the_url_gives(url: str, directory: str) -> None:
    assert clone_directory(url) == directory


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "git clone https://github.com/someone/construct-mcp.git",
            "git clone /src/checkout construct-mcp",
        ),
        (
            "git clone https://github.com/someone/construct-mcp.git && cd construct-mcp",
            "git clone /src/checkout construct-mcp && cd construct-mcp",
        ),
        ("git clone --depth 1 https://x.org/a/b.git mine", "git clone --depth 1 /src/checkout mine"),
        ("$ git clone -q git@github.com:a/tool.git  # get it", "$ git clone -q /src/checkout tool  # get it"),
    ],
)
def test_the_clone_line_clones_the_checkout(line: str, expected: str) -> None:
    script = with_local_clone(f"{line}\ncd construct-mcp\n", Path("/src/checkout"))
    assert script == f"{expected}\ncd construct-mcp\n"


def test_a_block_without_a_clone_line_is_refused() -> None:
    with pytest.raises(QuickstartError, match="no `git clone URL` line"):
        with_local_clone("pip install construct-mcp\n", Path("/src"))


def _readme(root: Path, *blocks: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    parts = ["# A project\n"]
    for body in blocks:
        parts.append(f"<!-- quickstart -->\n```sh\n{body}```\n")
    parts.append("```sh\nfalse  # not the quick start\n```\n")
    (root / "README.md").write_text("\n".join(parts), "utf-8")
    return root


def test_no_block_or_several_are_refused_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(QuickstartError, match=r"^no <!-- quickstart --> block in README\.md$"):
        quickstart_script(_readme(tmp_path / "none"), tmp_path)
    with pytest.raises(
        QuickstartError, match=r"several <!-- quickstart --> blocks: README.md:4, README.md:9"
    ):
        quickstart_script(
            _readme(tmp_path / "two", "git clone https://a/b\n", "git clone https://a/c\n"), tmp_path
        )
    assert main(["--checkout", str(tmp_path / "none")]) == EXIT_NOT_RUN
    assert "quickstart: no <!-- quickstart --> block in README.md" in capsys.readouterr().err


def _repository(path: Path, quickstart: str) -> Path:
    """A git repository whose README's quick start is ``quickstart``, committed."""
    _readme(path, quickstart)
    (path / "marker.txt").write_text("cloned\n", "utf-8")
    for command in (
        ["git", "init", "-q"],
        ["git", "add", "."],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "initial"],
    ):
        subprocess.run(command, cwd=path, check=True)
    return path


def test_the_block_runs_in_a_fresh_directory_on_a_clone_of_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-not-for-the-quick-start")
    monkeypatch.setenv("CONSTRUCT_WORKER_BACKEND", "provider")
    repo = _repository(
        tmp_path / "repo",
        "git clone -q https://github.com/someone/construct-mcp.git\n"
        "cd construct-mcp\n"
        "test -f marker.txt && test -f README.md\n"
        'test -z "${ANTHROPIC_API_KEY:-}" && test -z "${CONSTRUCT_WORKER_BACKEND:-}"\n'
        'test -d "$CONSTRUCT_HOME" || test ! -e "$CONSTRUCT_HOME"\n'
        'case "$PWD" in */construct-quickstart-*/newcomer/construct-mcp) ;; *) exit 7 ;; esac\n',
    )
    assert run(repo, repo, timeout=60) == 0


def test_a_failing_command_fails_the_quick_start_even_mid_block(tmp_path: Path) -> None:
    # set -e: the exit status is the failing command's, not the last line's.
    repo = _repository(tmp_path / "repo", "git clone -q https://x.org/a/proj.git\nfalse\ntrue\n")
    assert run(repo, repo, timeout=60) == 1


def test_a_quick_start_that_hangs_is_stopped(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo", "git clone -q https://x.org/a/proj.git\nsleep 30\n")
    assert run(repo, repo, timeout=2) == EXIT_TIMEOUT


def test_a_readers_environment_has_no_keys_and_its_own_home(tmp_path: Path) -> None:
    env = reader_environment(
        {"PATH": "/bin", "OPENAI_API_KEY": "k", "CONSTRUCT_STORE": "x", "OTEL_SDK_DISABLED": "1"}, tmp_path
    )
    assert env == {"PATH": "/bin", "CONSTRUCT_HOME": str(tmp_path)}
