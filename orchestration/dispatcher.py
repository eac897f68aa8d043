"""The dispatcher: executes runnable runs in the background with bounded concurrency.

It runs inside the server's lifespan. On start (when ``recover`` is true, the default) and then
every ``poll_seconds`` — or at once when :meth:`Dispatcher.wake` is called — it asks the store for
runnable runs (``queued`` ones whose ``not_before`` has passed, and ``running`` ones, which are
orphans when their lease has expired) and drives each through :meth:`Runtime.drive`, which claims the
run's lease first: a run another worker holds is skipped, so every run is executed by one worker at a
time, whatever the number of server processes on the store.

With ``recover=False`` it never scans the store: it drives only the runs it is woken for (the ones
this process starts or resumes), and leaves the rest to other processes or a later restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from anyio.abc import TaskStatus

from orchestration.decide import WaitUntil
from orchestration.errors import ConstructError
from orchestration.models import RunHead
from orchestration.runtime import Runtime

log = logging.getLogger("construct.dispatcher")


class Dispatcher:
    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int = 4,
        poll_seconds: float = 1.0,
        recover: bool = True,
        batch: int = 100,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.runtime = runtime
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.recover = recover
        self.batch = batch
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._active: set[str] = set()
        self._again: set[str] = set()
        self._woken: set[str] = set()
        self._wake = anyio.Event()
        self._stopping = False
        self.on_idle: Callable[[], None] | None = None
        #: set when :meth:`run` has returned (after :meth:`stop`, every drive finished)
        self.stopped = anyio.Event()

    def wake(self, run_id: str | None = None) -> None:
        """Look for work now (``run_id``: at least at this run). Safe from any task."""
        if run_id is not None:
            self._woken.add(run_id)
        self._wake.set()

    def stop(self) -> None:
        """Stop taking new work; runs being driven stop at their next step boundary, and
        :meth:`run` returns once they have (await :attr:`stopped`; bound the wait yourself)."""
        self._stopping = True
        self.runtime.stop()
        self._wake.set()

    @property
    def active(self) -> frozenset[str]:
        return frozenset(self._active)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled, or until :meth:`stop` and the drives in progress have returned."""
        self.runtime.add_listener(self._on_change)
        try:
            await self._run(task_status)
        finally:
            self.stopped.set()

    async def _run(self, task_status: TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            task_status.started()
            scan = self.recover
            while not self._stopping:
                self._wake = anyio.Event()
                candidates = list(self._woken)
                self._woken.clear()
                if scan:
                    try:
                        candidates += await self.runtime.store.runnable(self.runtime.clock.now(), self.batch)
                    except ConstructError as exc:
                        log.warning(
                            "cannot list runnable runs: %s", exc, extra={"action": "dispatch_scan_failed"}
                        )
                for run_id in dict.fromkeys(candidates):
                    if run_id in self._active:
                        # It changed while being driven: drive it once more when the current pass ends.
                        self._again.add(run_id)
                        continue
                    self._active.add(run_id)
                    tg.start_soon(self._drive, run_id)
                if self.on_idle is not None and not self._active:
                    self.on_idle()
                with anyio.move_on_after(self.poll_seconds):
                    await self._wake.wait()
                scan = self.recover
            # Leaving the task group waits for the drives in progress: each returns at its next
            # step boundary because the runtime is stopping.

    async def _on_change(self, head: RunHead) -> None:
        if head.status.kind == "active":
            self.wake(head.run_id)

    async def _drive(self, run_id: str) -> None:
        try:
            async with self._limiter:
                while not self._stopping:
                    self._again.discard(run_id)
                    try:
                        action = await self.runtime.drive(run_id)
                    except ConstructError as exc:
                        log.warning(
                            "run %s could not be advanced: %s",
                            run_id,
                            exc,
                            extra={"action": "drive_failed", "run_id": run_id, "code": exc.code},
                        )
                        break
                    except Exception:
                        log.exception("drive crashed", extra={"action": "drive_crashed", "run_id": run_id})
                        break
                    if isinstance(action, WaitUntil):
                        log.info(
                            "run %s waits until %s",
                            run_id,
                            action.not_before.isoformat(),
                            extra={"action": "durable_wait", "run_id": run_id},
                        )
                    if run_id not in self._again:
                        break
        finally:
            self._active.discard(run_id)
