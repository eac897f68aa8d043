-- 0004: tombstones of deleted runs (SQLite).
--
-- runs prune and runs import --move delete a run (its runs, facts and leases rows) and leave a
-- tombstone in one transaction (orchestration/store.py, "Retention"): what became of the run, as
-- JSON, and its idempotency key, which stays reserved (a start retried with it is refused with the
-- tombstone's error instead of starting the run again).
CREATE TABLE tombstones (
    run_id          TEXT PRIMARY KEY,
    idempotency_key TEXT,
    body            TEXT NOT NULL
);

-- SQLite lets several NULLs into a unique index, so tombstones of runs without a key never collide.
CREATE UNIQUE INDEX tombstones_idempotency_key ON tombstones (idempotency_key);
