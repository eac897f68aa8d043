-- 0001: runs, their fact logs and their leases (PostgreSQL).
--
-- Tables are created unqualified: the store's connections set search_path to the configured schema.

-- One row per run: the head as JSONB plus the columns that lists and the dispatcher filter on.
-- run_id uses the "C" collation so that ordering is by code point, as in every other adapter,
-- whatever the database's default collation is.
CREATE TABLE runs (
    run_id          text COLLATE "C" PRIMARY KEY,
    version         integer NOT NULL,
    status          text NOT NULL,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    not_before      timestamptz,
    idempotency_key text UNIQUE,
    head            jsonb NOT NULL
);

-- list_runs without a filter: newest first, keyset pagination on (created_at, run_id).
CREATE INDEX runs_created ON runs (created_at, run_id);

-- list_runs filtered by status.
CREATE INDEX runs_status_created ON runs (status, created_at, run_id);

-- runnable / claim_runnable: only the active runs, oldest first. Partial, so it stays small however
-- many finished runs the table holds.
CREATE INDEX runs_runnable ON runs (created_at, run_id) WHERE status IN ('queued', 'running');

-- The append-only log.
CREATE TABLE facts (
    run_id text COLLATE "C" NOT NULL REFERENCES runs (run_id),
    seq    integer NOT NULL,
    type   text NOT NULL,
    body   jsonb NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- At most one lease per run; expiry is judged with the caller's clock (RunStore docstring).
CREATE TABLE leases (
    run_id     text COLLATE "C" PRIMARY KEY REFERENCES runs (run_id),
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL
);
