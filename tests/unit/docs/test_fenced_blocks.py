"""docs/fenced_blocks.py on sample pages: what a block is (language, line, marker, text), and which
words of a shell block are ``construct-mcp`` commands — so that the example tests see every block a
reader sees, and a command the parser must check is never skipped for its spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from docs.fenced_blocks import Block, all_blocks, blocks_in, construct_commands, documentation_files

PAGE = """# Title

<!-- fragment -->
```toml
max_attempts = 3
```

<!-- quickstart -->
```sh
git clone https://example.org/construct-mcp.git
```

<!-- fragment -->

```python
print("the marker is not directly above: a whole script")
```

1. In a list:

    ```JSON
    {"a": 1}
    ```

````markdown
```toml
not a block of its own
```
````

```
no language
```
"""


def test_each_block_has_its_language_line_text_and_the_marker_directly_above() -> None:
    blocks = blocks_in(PAGE, "page.md")
    assert [(b.lang, b.line, b.marker) for b in blocks] == [
        ("toml", 4, "fragment"),
        ("sh", 9, "quickstart"),
        ("python", 15, None),
        ("json", 21, None),
        ("markdown", 25, None),
        ("", 31, None),
    ]
    assert blocks[0].text == "max_attempts = 3\n"
    assert blocks[3].text == '{"a": 1}\n'  # the list item's indentation taken off
    assert blocks[4].text == "```toml\nnot a block of its own\n```\n"
    assert blocks[0].where == "page.md:4"


def test_a_fence_never_closed_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"page.md:3: a fenced block that is never closed"):
        blocks_in("text\n\n```toml\nx = 1\n", "page.md")


def test_the_documentation_is_the_readme_and_every_page_below_docs(tmp_path: Path) -> None:
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    (tmp_path / "README.md").write_text("```json\n{}\n```\n")
    (tmp_path / "docs" / "index.md").write_text("```toml\n```\n")
    (tmp_path / "docs" / "reference" / "configuration.md").write_text("text\n")
    (tmp_path / "docs" / "notes.txt").write_text("```json\nnot markdown\n```\n")
    assert [p.relative_to(tmp_path).as_posix() for p in documentation_files(tmp_path)] == [
        "README.md",
        "docs/index.md",
        "docs/reference/configuration.md",
    ]
    assert [(b.where, b.lang, b.text) for b in all_blocks(tmp_path)] == [
        ("README.md:1", "json", "{}\n"),
        ("docs/index.md:1", "toml", ""),
    ]


def _commands(lang: str, text: str) -> list[tuple[int, list[str]]]:
    return construct_commands(Block("p.md", 10, lang, text))


def test_construct_mcp_commands_are_found_however_they_are_written() -> None:
    text = (
        "construct-mcp runs list --limit 5\n"
        "$ construct-mcp runs status <run-id> --full\n"
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/construct-mcp demo\n"
        "CONSTRUCT_HOME=/tmp/h construct-mcp runs list | head -3  # newest first\n"
        "construct-mcp runs export RUN > out.json 2>err.log\n"
        "construct-mcp runs start 'a request' \\\n"
        "  --chain review-loop\n"
        "uvx --from dist/construct_mcp-0.1.0-py3-none-any.whl construct-mcp demo\n"
        "claude mcp add construct-mcp -- /abs/.venv/bin/construct-mcp serve --log-level INFO\n"
    )
    assert _commands("sh", text) == [
        (11, ["runs", "list", "--limit", "5"]),
        (12, ["runs", "status", "run-id", "--full"]),
        (13, ["demo"]),
        (14, ["runs", "list"]),
        (15, ["runs", "export", "RUN"]),
        (16, ["runs", "start", "a request", "--chain", "review-loop"]),
        (18, ["demo"]),
        (19, ["serve", "--log-level", "INFO"]),
    ]


def test_words_that_only_name_the_project_are_not_commands() -> None:
    text = (
        "git clone https://github.com/someone/construct-mcp\n"
        "cd construct-mcp\n"
        "pip install construct-mcp\n"
        "echo construct-mcp serve\n"
        "# construct-mcp serve\n"
    )
    assert _commands("bash", text) == []


def test_a_console_block_with_prompts_checks_only_the_prompted_lines() -> None:
    text = "$ construct-mcp runs list\nconstruct-mcp: no runs in /tmp/x\n$ construct-mcp migrate --check\n"
    assert _commands("console", text) == [(11, ["runs", "list"]), (13, ["migrate", "--check"])]
    assert _commands("console", "construct-mcp demo\n") == [(11, ["demo"])]  # no prompts: every line


def test_a_line_the_shell_could_not_split_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"p.md:11: No closing quotation"):
        _commands("sh", "construct-mcp runs start 'unclosed\n")
