"""A child process for ``test_filesystem.py`` (not a test module): it works on a
:class:`~stores.filesystem.FilesystemStore` from a separate process, and can die on purpose at a
chosen system call to simulate a crash (``os._exit``: no cleanup, no ``finally``, like SIGKILL).

Commands::

    append ROOT RUN_ID TAG N BARRIER PEERS   N compare-and-swap appends, retrying on conflicts
    create ROOT RUN_ID KEY BARRIER TAG PEERS  create a run with an idempotency key
    crash-create ROOT RUN_ID KEY CRASH        create a run, dying at CRASH
    crash-append ROOT RUN_ID CRASH            append one write, dying at CRASH

``CRASH`` is ``FUNC:N[:torn]``: die just before the N-th call of ``os.FUNC`` during the store call
(with ``torn``, that call first writes half of its bytes). ``BARRIER`` is a directory where the
peers announce themselves, so they all start working at the same moment.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from orchestration.errors import VersionConflict
from stores.filesystem import FilesystemStore
from tests.stores.builders import complete_task, new_run, start_attempt

CRASH_EXIT = 77
log = logging.getLogger("construct.tests.fs_child")


def install_crash(spec: str) -> None:
    func_name, nth_text, *flags = spec.split(":")
    nth = int(nth_text)
    real: Callable[..., Any] = getattr(os, func_name)
    calls = 0

    def crashing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth:
            if "torn" in flags:
                fd, data = args[0], bytes(args[1])
                real(fd, data[: max(1, len(data) // 2)])
            os._exit(CRASH_EXIT)
        return real(*args, **kwargs)

    setattr(os, func_name, crashing)


def wait_for_peers(barrier: Path, tag: str, peers: int) -> None:
    (barrier / f"{tag}.ready").touch()
    deadline = time.monotonic() + 30
    while len(list(barrier.glob("*.ready"))) < peers:
        if time.monotonic() > deadline:
            raise TimeoutError("the other processes did not start")
        time.sleep(0.001)


async def append_loop(root: Path, run_id: str, tag: str, n: int) -> int:
    store = FilesystemStore(root)
    done = conflicts = 0
    while done < n:
        head = await store.load(run_id)
        write = start_attempt(head, executor=f"provider:{tag}:m")
        try:
            await store.append(run_id, write.expected_version, write.facts, write.head)
            done += 1
        except VersionConflict:
            conflicts += 1
    await store.close()
    return conflicts


async def create_keyed(root: Path, run_id: str, key: str) -> bool:
    store = FilesystemStore(root)
    result = await store.create(*new_run(run_id, key=key))
    await store.close()
    return result.created


async def crash_create(root: Path, run_id: str, key: str, crash: str) -> None:
    store = FilesystemStore(root)
    await store.list_runs()  # lay the store out before arming the crash
    install_crash(crash)
    await store.create(*new_run(run_id, key=key))


async def crash_append(root: Path, run_id: str, crash: str) -> None:
    store = FilesystemStore(root)
    head = await store.load(run_id)
    write = complete_task(head, output="an output that never became durable")
    install_crash(crash)
    await store.append(run_id, write.expected_version, write.facts, write.head)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    command, root, run_id, *rest = argv
    if command == "append":
        tag, n, barrier, peers = rest
        wait_for_peers(Path(barrier), tag, int(peers))
        conflicts = anyio.run(append_loop, Path(root), run_id, tag, int(n))
        log.warning("%s: %s appends, %d version conflicts retried", tag, n, conflicts)
    elif command == "create":
        key, barrier, tag, peers = rest
        wait_for_peers(Path(barrier), tag, int(peers))
        created = anyio.run(create_keyed, Path(root), run_id, key)
        (Path(barrier) / f"{tag}.result").write_text("created" if created else "existing")
    elif command == "crash-create":
        key, crash = rest
        anyio.run(crash_create, Path(root), run_id, key, crash)
    elif command == "crash-append":
        (crash,) = rest
        anyio.run(crash_append, Path(root), run_id, crash)
    else:
        raise SystemExit(f"unknown command {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
