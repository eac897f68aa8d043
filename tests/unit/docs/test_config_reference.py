"""docs/reference/configuration.md is the page docs/gen_config_reference.py renders from the settings
model (issue 26): the committed page is current, the check catches a page that drifted, and every
setting a reader can write is on it with a description."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from docs.gen_config_reference import PAGE, ROOT, main, render
from server.settings.config import ENV_VARS, Settings
from server.settings.sources import file_keys, table_of


def test_the_committed_page_is_the_one_the_model_renders() -> None:
    # As CI and a reader run it: a script, from another directory.
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_config_reference.py"), "--check"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert PAGE.read_text("utf-8") == render()


def test_the_check_fails_on_a_page_that_drifted_or_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "configuration.md"
    assert main(["--check"], page) == 1
    assert main([], page) == 0 and main(["--check"], page) == 0
    page.write_text(page.read_text("utf-8").replace("| `3` |", "| `4` |", 1), "utf-8")
    assert main(["--check"], page) == 1
    assert "is out of date: run `python docs/gen_config_reference.py`" in capsys.readouterr().err


def test_every_variable_key_and_table_is_on_the_page_with_a_description() -> None:
    page = render()
    for variable in ENV_VARS:
        shown = f"`{variable}*`" if variable.endswith("_") else f"`{variable}`"
        assert shown in page, variable
    for key in file_keys(Settings):
        assert f"`{key}`" in page or f"[{key}." in page or f"[{key}]" in page, key
    for name, field in Settings.model_fields.items():
        if table_of(field) is not None or name in ENV_VARS.values():
            assert field.description, f"Settings.{name} has no description for the reference"
        table = table_of(field)
        if table is not None:
            single = isinstance(field.annotation, type)  # one table, such as [auth]
            model = field.annotation if single else typing.get_args(field.annotation)[1]
            assert isinstance(model, type) and issubclass(model, BaseModel), name
            assert (f"### `[{name}]`" if single else f"### `[{name}.") in page, name
            if model.__module__.startswith("server.settings"):
                missing = [k for k, sub in model.model_fields.items() if not sub.description]
                assert not missing, f"[{name}] keys without a description: {missing}"
