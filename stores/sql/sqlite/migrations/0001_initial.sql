-- 0001: runs, their fact logs and their leases (SQLite).
--
-- Times are fixed-width UTC text (stores._common.sortable_time), so that text order is time order
-- and the indexes below serve range scans and sorts.

-- One row per run: the head as JSON plus the columns that lists and the dispatcher filter on.
CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    version         INTEGER NOT NULL,
    status          TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    not_before      TEXT,
    idempotency_key TEXT,
    head            TEXT NOT NULL
);

-- SQLite lets several NULLs into a unique index, so runs without a key never collide.
CREATE UNIQUE INDEX runs_idempotency_key ON runs (idempotency_key);

-- list_runs without a filter: newest first, keyset pagination on (created_at, run_id).
CREATE INDEX runs_created ON runs (created_at, run_id);

-- list_runs filtered by status.
CREATE INDEX runs_status_created ON runs (status, created_at, run_id);

-- runnable / claim_runnable: only the active runs, oldest first. Partial, so it stays small however
-- many finished runs the table holds.
CREATE INDEX runs_runnable ON runs (created_at, run_id) WHERE status IN ('queued', 'running');

-- The append-only log. A rowid table (not WITHOUT ROWID) because bodies carry whole task outputs,
-- far larger than the row size WITHOUT ROWID tables are meant for.
CREATE TABLE facts (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    seq    INTEGER NOT NULL,
    type   TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- At most one lease per run; expiry is judged with the caller's clock (RunStore docstring).
CREATE TABLE leases (
    run_id     TEXT PRIMARY KEY REFERENCES runs (run_id),
    owner      TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
