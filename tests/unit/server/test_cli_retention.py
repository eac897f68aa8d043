"""``runs export``, ``runs import`` and ``runs prune`` from the command line (in process): a run
moves from the filesystem store to SQLite through a file, a tampered file and a live run are
refused with their codes, ``--move --from`` takes a live run out of its store, and a prune lists
(``--dry-run``) or deletes ended runs, archiving them first (``--export-dir``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import pytest

from orchestration.core import StartRequest
from server.cli.main import run
from stores.filesystem import FilesystemStore
from tests.stores.test_export_import import rehashed, runtime_on, tamper
from tests.unit.helpers import play


def setup_runs(root: Path) -> dict[str, str]:
    """Two ended runs and one waiting for its host, on a filesystem store, recorded on 2026-01-01
    (the manual clock): long before "now"."""

    async def record() -> dict[str, str]:
        store = FilesystemStore(root)
        runtime = runtime_on(store)
        runs = {}
        for name in ("first", "second"):
            head, _ = await runtime.start(StartRequest(name, idempotency_key=f"key-{name}"))
            runs[name] = (await play(runtime, head.run_id)).run_id
        head, _ = await runtime.start(StartRequest("live", chain="gated-revise"))
        await runtime.drive(head.run_id)
        runs["live"] = head.run_id
        await store.close()
        return runs

    return anyio.run(record)


def cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = run(list(args), out=out)
    return code, out.getvalue()


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, Path]:
    monkeypatch.delenv("CONSTRUCT_ORCHESTRATION_STORE", raising=False)
    return f"file://{tmp_path}/fs", f"sqlite:///{tmp_path}/target.db", tmp_path


def test_a_run_moves_from_the_filesystem_store_to_sqlite_through_a_file(
    stores: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fs, sqlite, tmp = stores
    runs = setup_runs(tmp / "fs")
    home = ("--home", str(tmp / "home"))
    file = tmp / "first.jsonl"
    code, said = cli("runs", "export", runs["first"], "--store", fs, "--out", str(file), *home)
    assert code == 0 and str(file) in said
    header = json.loads(file.read_text().splitlines()[0])
    assert header["format"] == "construct-mcp.run-export" and header["run_id"] == runs["first"]

    code, said = cli("runs", "import", str(file), "--store", sqlite, "--json", *home)
    assert code == 0, capsys.readouterr().err
    assert json.loads(said)["run_id"] == runs["first"]
    code, said = cli("runs", "status", runs["first"], "--store", sqlite, "--json", *home)
    assert code == 0 and json.loads(said)["status"] == "completed"
    # Again: the target has it.
    assert cli("runs", "import", str(file), "--store", sqlite, *home)[0] == 1
    assert capsys.readouterr().err.startswith("conflict:")

    # A changed byte: refused with its code, nothing imported.
    second = tmp / "second.jsonl"
    assert cli("runs", "export", runs["second"], "--store", fs, "--out", str(second), *home)[0] == 0
    second.write_text(second.read_text().replace('"second"', '"changed"', 1))
    assert cli("runs", "import", str(second), "--store", sqlite, *home)[0] == 1
    assert capsys.readouterr().err.startswith("export_corrupt:")
    assert cli("runs", "status", runs["second"], "--store", sqlite, *home)[0] == 1
    assert capsys.readouterr().err.startswith("run_not_found:")

    # Files that cannot be read or written: a coded error, no traceback.
    assert cli("runs", "import", str(tmp / "missing.jsonl"), "--store", sqlite, *home)[0] == 1
    assert capsys.readouterr().err.startswith("invalid_argument: cannot read")
    (tmp / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    assert cli("runs", "import", str(tmp / "binary.jsonl"), "--store", sqlite, *home)[0] == 1
    assert capsys.readouterr().err.startswith("export_corrupt:")
    nowhere = str(tmp / "no" / "such" / "dir" / "x.jsonl")
    assert cli("runs", "export", runs["first"], "--store", fs, "--out", nowhere, *home)[0] == 1
    assert capsys.readouterr().err.startswith("invalid_argument: cannot write")


def test_a_live_run_is_imported_only_when_moved(
    stores: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fs, sqlite, tmp = stores
    runs = setup_runs(tmp / "fs")
    home = ("--home", str(tmp / "home"))
    code, lines = cli("runs", "export", runs["live"], "--store", fs, *home)  # to stdout
    assert code == 0
    file = tmp / "live.jsonl"
    file.write_text(lines)
    assert cli("runs", "import", str(file), "--store", sqlite, *home)[0] == 1
    assert capsys.readouterr().err.startswith("invalid_state:")
    assert cli("runs", "import", str(file), "--store", sqlite, "--move", *home)[0] == 2  # usage
    assert "--from" in capsys.readouterr().err
    # Relabelled completed, its hashes recomputed: what its facts say decides, moved or not.
    relabelled = tmp / "relabelled.jsonl"
    edited = rehashed(tamper(lines.splitlines(), 1, lambda r: r.update(status="completed")))
    relabelled.write_text("\n".join(edited) + "\n")
    for move in ((), ("--move", "--from", fs)):
        assert cli("runs", "import", str(relabelled), "--store", sqlite, *move, *home)[0] == 1
        err = capsys.readouterr().err
        assert err.startswith(f"export_corrupt: {relabelled}: run {runs['live']}: the head does not match")
        assert '"completed" in the head, "awaiting_host" by its facts' in err
    assert cli("runs", "status", runs["live"], "--store", fs, *home)[0] == 0

    code, said = cli("runs", "import", str(file), "--store", sqlite, "--move", "--from", fs, *home)
    assert code == 0, capsys.readouterr().err
    assert "moved out of" in said
    code, said = cli("runs", "status", runs["live"], "--store", sqlite, "--json", *home)
    assert code == 0 and json.loads(said)["status"] == "awaiting_host"
    assert cli("runs", "status", runs["live"], "--store", fs, *home)[0] == 1
    assert capsys.readouterr().err.startswith("run_moved:")


def test_prune_lists_archives_and_deletes_ended_runs(
    stores: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fs, sqlite, tmp = stores
    runs = setup_runs(tmp / "fs")
    home = ("--home", str(tmp / "home"))
    code, said = cli("runs", "prune", "--older-than", "30d", "--dry-run", "--store", fs, "--json", *home)
    assert code == 0
    dry = json.loads(said)
    assert dry["dry_run"] and sorted(dry["pruned"]) == sorted([runs["first"], runs["second"]])
    assert cli("runs", "status", runs["first"], "--store", fs, *home)[0] == 0

    archive = tmp / "archive"
    code, said = cli(
        "runs", "prune", "--older-than", "30d", "--export-dir", str(archive), "--store", fs, *home
    )
    assert code == 0 and "pruned 2 run(s)" in said
    assert sorted(p.name for p in archive.iterdir()) == sorted(
        f"{r}.jsonl" for r in (runs["first"], runs["second"])
    )
    assert cli("runs", "status", runs["first"], "--store", fs, *home)[0] == 1
    assert capsys.readouterr().err.startswith("run_pruned:")
    code, said = cli("runs", "status", runs["live"], "--store", fs, "--json", *home)
    assert code == 0 and json.loads(said)["status"] == "awaiting_host"
    # A retried start with a pruned run's key says so instead of starting it again.
    assert cli("runs", "start", "first", "--idempotency-key", "key-first", "--store", fs, *home)[0] == 1
    assert capsys.readouterr().err.startswith("run_pruned:")
    # The archive restores the run, here or in another store.
    assert cli("runs", "import", str(archive / f"{runs['first']}.jsonl"), "--store", sqlite, *home)[0] == 0

    # Usage errors (exit 2), said with the command's usage and the flag.
    for bad in (("--older-than", "soon"), ("--older-than", "1d", "--status", "queued")):
        assert cli("runs", "prune", *bad, "--store", fs, *home)[0] == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: construct-mcp runs prune") and f"argument {bad[-2]}: " in err
