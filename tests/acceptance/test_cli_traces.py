"""A run driven by the CLI is traced as one driven by the server (issue 14, part 1): with the
standard OTEL_* variables, ``construct-mcp runs start`` (a real process) exports the drive's span,
named for the chain and carrying the run id, on stderr with the console exporter — stdout keeps
the answer alone. Without the variables nothing is exported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def runs_start(home: Path, **otel: str) -> tuple[dict[str, object], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {"CONSTRUCT_HOME": str(home), **otel}
    argv = [sys.executable, "-m", "server", "runs", "start", "Write it", "--specialists", "writer", "--json"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True)
    answer: dict[str, object] = json.loads(done.stdout)  # stdout is the answer, nothing else
    return answer, done.stderr


def test_the_cli_exports_the_spans_of_the_run_it_drives(tmp_path: Path) -> None:
    view, stderr = runs_start(tmp_path, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="construct-cli")
    assert view["status"] == "awaiting_host"
    assert '"name": "run custom"' in stderr
    assert f'"construct.run.id": "{view["run_id"]}"' in stderr
    assert "Write it" not in stderr  # the request is never a span attribute


def test_without_the_variables_the_cli_exports_nothing(tmp_path: Path) -> None:
    view, stderr = runs_start(tmp_path)
    assert view["status"] == "awaiting_host"
    assert '"name": "run custom"' not in stderr and "trace_id" not in stderr
