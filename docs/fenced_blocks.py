"""The fenced code blocks of the documentation (README.md and every docs/**/*.md), which the tests
execute or parse (tests/unit/docs/, tests/acceptance/test_docs_python_examples.py) and CI runs
(docs/run_quickstart.py).

A block is a fence of three or more backticks at the start of a line, with a language, closed by a
fence of at least as many backticks. A marker comment on the line directly above the opening fence
says what the block is:

- ``<!-- fragment -->``: a piece of a file, not a whole one (a TOML fragment parses with tomllib, a
  Python excerpt compiles, instead of loading as a config file or running as a script);
- ``<!-- quickstart -->``: the README's install-and-demo block, which CI runs verbatim;
- ``<!-- session -->``: a step of a page's worked example, which
  tests/acceptance/test_docs_sessions.py runs in order in a fresh home: a ``toml`` block is written as
  its ``construct.toml``, a ``console`` block's ``$`` commands run and print what it shows.

The languages checked are ``toml``, ``json``, ``python``, ``sh``, ``bash`` and ``console``. Blocks in
any other language (``text``, ``mermaid``, ...) and fences without a language are allowed and
ignored: they are read, not run.

Shell blocks: the commands that run ``construct-mcp`` are found by :func:`construct_commands` (see
its docstring for the rules), so the tests can parse each with the real CLI parser.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Marker = Literal["fragment", "quickstart", "session"]

#: The languages the tests check; every other one is ignored.
CHECKED = frozenset({"toml", "json", "python", "sh", "bash", "console"})
SHELL = frozenset({"sh", "bash", "console"})

_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})[ \t]*(?P<lang>[^\s`{]*)[^`]*$")
_MARKER = re.compile(r"^<!--\s*(fragment|quickstart|session)\s*-->\s*$")
#: Words that run the command after them: the construct-mcp word may follow (after ``--`` when given).
_LAUNCHERS = frozenset({"uvx", "pipx", "claude", "env", "exec", "nohup", "time", "timeout", "sudo"})
#: A launcher's options whose value names a package, not the command (``uvx --from construct-mcp ...``).
_PACKAGE_OPTIONS = frozenset({"--from", "--with", "--spec"})
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", ";;", "|&"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PLACEHOLDER = re.compile(r"<([A-Za-z][A-Za-z0-9_.-]*)>")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: the file (relative to the checkout), the line of its opening fence
    (1-based), its language (lower case, ``""`` when none), its text (ending with a newline unless
    empty) and the marker directly above it, if any."""

    path: str
    line: int
    lang: str
    text: str
    marker: Marker | None = None

    @property
    def where(self) -> str:
        """``path:line``, as a test id and in failure messages."""
        return f"{self.path}:{self.line}"


def documentation_files(root: Path) -> list[Path]:
    """README.md (when present) and every ``docs/**/*.md`` below ``root``, in a stable order."""
    readme = root / "README.md"
    pages = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    return [readme, *pages] if readme.is_file() else pages


def blocks_in(text: str, path: str) -> list[Block]:
    """The fenced blocks of one markdown text (an indented fence, in a list item, too: its
    indentation is taken off the block's lines). Raises ValueError for a fence that is never closed
    (the rest of the page would be read as code)."""
    lines = text.split("\n")
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _OPEN.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        close = next((j for j in range(index + 1, len(lines)) if _closes(lines[j], fence)), None)
        if close is None:
            raise ValueError(f"{path}:{index + 1}: a fenced block that is never closed")
        body = "\n".join(_dedent(line, indent) for line in lines[index + 1 : close])
        found.append(
            Block(
                path=path,
                line=index + 1,
                lang=opening.group("lang").lower(),
                text=f"{body}\n" if body else "",
                marker=_marker(lines[index - 1]) if index > 0 else None,
            )
        )
        index = close + 1
    return found


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and not stripped.strip("`")


def _dedent(line: str, indent: str) -> str:
    return line[len(indent) :] if line.startswith(indent) else line.lstrip(" ")


def _marker(line: str) -> Marker | None:
    found = _MARKER.match(line.strip())
    if found is None:
        return None
    marker: Marker = "session" if found.group(1) == "session" else "fragment"
    return "quickstart" if found.group(1) == "quickstart" else marker


def all_blocks(root: Path) -> list[Block]:
    """Every fenced block of the documentation below ``root`` (see :func:`documentation_files`)."""
    return [
        block
        for file in documentation_files(root)
        for block in blocks_in(file.read_text("utf-8"), file.relative_to(root).as_posix())
    ]


def quickstart_blocks(root: Path) -> list[Block]:
    """The README's blocks marked ``<!-- quickstart -->`` (the README must have exactly one)."""
    readme = root / "README.md"
    return [b for b in blocks_in(readme.read_text("utf-8"), "README.md") if b.marker == "quickstart"]


def _command_lines(block: Block) -> Iterator[tuple[int, str]]:
    """``(line number, command text)`` of a shell block: ``\\``-continued lines joined; in a
    ``console`` block that has ``$`` prompts only the prompted lines (the rest is output); a
    leading ``$ `` is dropped."""
    lines = block.text.splitlines()
    prompted = block.lang == "console" and any(line.startswith("$ ") for line in lines)
    pending: list[str] = []
    start = 0
    for offset, raw in enumerate(lines, start=block.line + 1):
        if not pending:
            if prompted and not raw.startswith("$ "):
                continue
            start = offset
            raw = raw.removeprefix("$ ")
        if raw.endswith("\\"):
            pending.append(raw[:-1])
            continue
        yield start, " ".join([*pending, raw])
        pending = []
    if pending:
        yield start, " ".join(pending)


def construct_argv(words: list[str]) -> list[str] | None:
    """The arguments of ``construct-mcp`` in one simple command (its words, as a host config's
    ``[command, *args]`` too), or None when it does not run ``construct-mcp`` (see
    :func:`construct_commands`)."""
    while words and _ASSIGNMENT.match(words[0]):
        words = words[1:]  # VAR=value construct-mcp ...
    if not words:
        return None
    if _is_construct(words[0]):
        return words[1:]
    if words[0] not in _LAUNCHERS:
        return None
    rest = words[words.index("--") + 1 :] if "--" in words else words[1:]
    at = next(
        (
            i
            for i, word in enumerate(rest)
            if _is_construct(word) and not (i > 0 and rest[i - 1] in _PACKAGE_OPTIONS)
        ),
        None,
    )
    return None if at is None else rest[at + 1 :]


def _is_construct(word: str) -> bool:
    """``construct-mcp`` or a path to it (``.venv/bin/construct-mcp``, ``C:\\...\\construct-mcp.exe``),
    not a URL."""
    name = re.split(r"[/\\]", word)[-1].removesuffix(".exe")
    return "://" not in word and name == "construct-mcp"


def _without_redirections(words: list[str]) -> list[str]:
    """A command's words without its redirections (``> file``, ``2>&1``, ``< in``)."""
    kept: list[str] = []
    skip = False
    for index, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word and set(word) <= set("<>&"):
            skip = True  # the operator's target follows
            if kept and kept[-1].isdigit() and index > 0 and words[index - 1] == kept[-1]:
                kept.pop()  # the file descriptor before it (2>file)
            continue
        kept.append(word)
    return kept


def construct_commands(block: Block) -> list[tuple[int, list[str]]]:
    """``(line number, arguments)`` of every ``construct-mcp`` command of a shell block.

    A command is a simple command of a line (split at ``&&``, ``||``, ``;``, ``|``; a leading
    ``$ `` prompt dropped; comments, redirections and ``VAR=value`` prefixes ignored; ``<name>``
    placeholders read as ``name``) whose first word is ``construct-mcp`` or a path to it
    (``.venv/bin/construct-mcp``), or a launcher (``uvx``, ``pipx``, ``claude``, ``env``, ...)
    followed by such a word (after ``--`` when the launcher line has one: ``claude mcp add name --
    construct-mcp serve``). Raises ValueError for a line the shell could not split (an unclosed
    quote)."""
    found: list[tuple[int, list[str]]] = []
    for line, command in _command_lines(block):
        lexer = shlex.shlex(_PLACEHOLDER.sub(r"\1", command), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError as exc:
            raise ValueError(f"{block.path}:{line}: {exc}") from None
        simple: list[str] = []
        for word in [*words, ";"]:
            if word not in _SEPARATORS:
                simple.append(word)
                continue
            argv = construct_argv(_without_redirections(simple))
            if argv is not None:
                found.append((line, argv))
            simple = []
    return found


__all__ = [
    "CHECKED",
    "SHELL",
    "Block",
    "Marker",
    "all_blocks",
    "blocks_in",
    "construct_argv",
    "construct_commands",
    "documentation_files",
    "quickstart_blocks",
]
