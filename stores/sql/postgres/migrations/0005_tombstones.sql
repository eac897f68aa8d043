-- 0005: tombstones of deleted runs (PostgreSQL).
--
-- runs prune and runs import --move delete a run (its runs, facts and leases rows) and leave a
-- tombstone in one transaction (orchestration/store.py, "Retention"): what became of the run, as
-- JSON text, and its idempotency key, which stays reserved (a start retried with it is refused with
-- the tombstone's error instead of starting the run again).
CREATE TABLE tombstones (
    run_id          text COLLATE "C" PRIMARY KEY,
    idempotency_key text UNIQUE,
    body            text NOT NULL
);
