"""Imports go server -> orchestration <- stores (DESIGN §5): orchestration imports neither of the
others; stores import only orchestration; HTTP client code lives only under orchestration/workers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    return files


def test_orchestration_imports_neither_server_nor_stores() -> None:
    for path in modules("orchestration"):
        bad = {n for n in imported_top_levels(path) if n.split(".")[0] in ("server", "stores")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_stores_import_only_orchestration() -> None:
    for path in modules("stores"):
        bad = {n for n in imported_top_levels(path) if n.split(".")[0] == "server"}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_http_clients_only_in_workers() -> None:
    for package in ("orchestration", "stores", "server"):
        for path in modules(package):
            if "workers" in path.relative_to(ROOT).parts:
                continue
            bad = {n for n in imported_top_levels(path) if n.split(".")[0] in ("httpx", "httpx2")}
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_scanner_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import os\nfrom server.app import x\nfrom . import y\n")
    assert imported_top_levels(sample) == {"os", "server.app"}
