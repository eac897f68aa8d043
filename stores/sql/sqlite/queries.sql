-- Named queries of the sqlite adapter (stores/sqlite.py). Parameters are named (:name).
-- Times are stores._common.sortable_time text.

-- name: enable_wal
-- Persistent: once set, every later connection to the file is in WAL mode too.
PRAGMA journal_mode = WAL

-- name: synchronous_full
-- A commit is on disk when it returns (NORMAL would lose the last commits on power loss in WAL mode).
PRAGMA synchronous = FULL

-- name: foreign_keys_on
PRAGMA foreign_keys = ON

-- name: begin_immediate
-- Every write transaction: takes the file's write lock up front (waiting up to the busy timeout), so
-- what the transaction reads cannot change before it commits.
BEGIN IMMEDIATE

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL
)

-- name: migrations_table_exists
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'

-- name: schema_version
SELECT coalesce(max(version), 0) FROM schema_migrations

-- name: record_migration
INSERT INTO schema_migrations (version, name, applied_at) VALUES (:version, :name, :applied_at)

-- name: head_by_idempotency_key
SELECT run_id, CASE WHEN chain IS NULL THEN head ELSE substr(head, 1, length(head) - 1) || ',"chain":' || chain || '}' END FROM runs WHERE idempotency_key = :idempotency_key

-- name: run_version
SELECT version FROM runs WHERE run_id = :run_id

-- name: lease_of
-- The run's lease as stored, expired or not (ReadsLeases.lease_of): a read, it claims nothing.
SELECT owner, expires_at, token FROM leases WHERE run_id = :run_id

-- name: run_versions
-- The versions of many runs in one statement (RunStore.versions): :run_ids is a JSON array of ids.
SELECT run_id, version FROM runs WHERE run_id IN (SELECT value FROM json_each(:run_ids))

-- name: insert_run
INSERT INTO runs (run_id, version, status, created_at, updated_at, not_before, idempotency_key, head, wake_at, chain)
VALUES (:run_id, :version, :status, :created_at, :updated_at, :not_before, :idempotency_key, :head, :wake_at, :chain)

-- name: insert_fact
INSERT INTO facts (run_id, seq, type, body) VALUES (:run_id, :seq, :type, :body)

-- name: update_head
-- An append's compare-and-swap: no row changes unless the stored version is the one the writer read
-- and the append's first fact follows the log's last one (the fact before it exists).
UPDATE runs
SET version = :version, status = :status, updated_at = :updated_at, not_before = :not_before, head = :head,
    wake_at = :wake_at
WHERE run_id = :run_id AND version = :expected_version
  AND EXISTS (SELECT 1 FROM facts WHERE run_id = :run_id AND seq = :previous_seq)

-- name: update_head_fenced
-- update_head for a fenced append: also no row changes unless the run's lease still carries the
-- writer's token.
UPDATE runs
SET version = :version, status = :status, updated_at = :updated_at, not_before = :not_before, head = :head,
    wake_at = :wake_at
WHERE run_id = :run_id AND version = :expected_version
  AND EXISTS (SELECT 1 FROM facts WHERE run_id = :run_id AND seq = :previous_seq)
  AND EXISTS (SELECT 1 FROM leases WHERE run_id = :run_id AND token = :token)

-- name: update_chain
-- The chain of a run an append moves to another chain (chain_upgraded), in that append's transaction
-- after its compare-and-swap; no other append writes the chain.
UPDATE runs SET chain = :chain WHERE run_id = :run_id

-- name: load_head
-- The head as written (a JSON object) with the chain snapshot written once at creation put back in
-- as its last key (migration chain_written_once); a head that holds its own chain is read as it is.
SELECT CASE WHEN chain IS NULL THEN head ELSE substr(head, 1, length(head) - 1) || ',"chain":' || chain || '}' END FROM runs WHERE run_id = :run_id

-- name: read_facts
-- LIMIT -1 is SQLite's "no limit".
SELECT seq, body FROM facts WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq LIMIT :limit

-- name: read_fact
SELECT seq, body FROM facts WHERE run_id = :run_id AND seq = :seq

-- name: list_runs
-- Keyset pagination, newest first; "no cursor" passes a key after every real one.
SELECT run_id, created_at, CASE WHEN chain IS NULL THEN head ELSE substr(head, 1, length(head) - 1) || ',"chain":' || chain || '}' END FROM runs
WHERE (created_at, run_id) < (:after_created, :after_run_id)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit

-- name: list_runs_by_status
-- :statuses is a JSON array of status names.
SELECT run_id, created_at, CASE WHEN chain IS NULL THEN head ELSE substr(head, 1, length(head) - 1) || ',"chain":' || chain || '}' END FROM runs
WHERE status IN (SELECT value FROM json_each(:statuses))
  AND (created_at, run_id) < (:after_created, :after_run_id)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit

-- name: runnable
-- Two disjoint sets, each read through its own index and each limited: the active runs (due queued
-- ones and running ones) and the other runs whose wake_at passed (a range scan of runs_wake_at,
-- sorted: there are only ever a few). Disjoint, so UNION ALL needs no de-duplication.
-- INDEXED BY: without statistics the planner prefers runs_status_created and then sorts every active
-- run; the partial index yields them already in order, so LIMIT stops early. The status IN (...) term
-- repeats the index's condition word for word, which SQLite needs to accept the partial index.
SELECT run_id FROM (
    SELECT * FROM (
        SELECT run_id, created_at FROM runs INDEXED BY runs_runnable
        WHERE status IN ('queued', 'running')
          AND (status = 'running' OR not_before IS NULL OR not_before <= :now)
        ORDER BY created_at, run_id
        LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, created_at FROM runs INDEXED BY runs_wake_at
        WHERE wake_at <= :now
          AND NOT (status IN ('queued', 'running')
                   AND (status = 'running' OR not_before IS NULL OR not_before <= :now))
        ORDER BY created_at, run_id
        LIMIT :limit
    )
)
ORDER BY created_at, run_id
LIMIT :limit

-- name: claim_lease
-- Take the lease if it is free, expired or already ours, with a new token (which fences the previous
-- holder, even when that is us); no row comes back when another owner holds an unexpired lease.
INSERT INTO leases (run_id, owner, expires_at, token) VALUES (:run_id, :owner, :expires_at, :token)
ON CONFLICT (run_id) DO UPDATE
SET owner = excluded.owner, expires_at = excluded.expires_at, token = excluded.token
WHERE leases.expires_at <= :now OR leases.owner = excluded.owner
RETURNING run_id

-- name: renew_lease
-- Only while the lease carries the caller's token (expired or not: nobody claimed it since).
UPDATE leases SET expires_at = :expires_at WHERE run_id = :run_id AND token = :token

-- name: renew_leases
-- renew_lease for many leases in one statement: :leases is a JSON array of [run_id, token] pairs.
UPDATE leases SET expires_at = :expires_at
FROM (SELECT json_extract(value, '$[0]') AS run_id, json_extract(value, '$[1]') AS token
      FROM json_each(:leases)) AS held
WHERE leases.run_id = held.run_id AND leases.token = held.token
RETURNING run_id

-- name: release_lease
DELETE FROM leases WHERE run_id = :run_id AND token = :token

-- name: lease_held
-- Why a fenced append's update changed no row, inside its transaction: does the run's lease still
-- carry the writer's token?
SELECT 1 FROM leases WHERE run_id = :run_id AND token = :token

-- name: claim_runnable
-- Runnable runs (as runnable defines them, through the same two indexes) whose lease is free or
-- expired, oldest first (a run this owner already holds is being worked on: it is not handed out
-- again). The caller holds BEGIN IMMEDIATE, so no other writer can claim between this select and the
-- claim_lease upserts that follow.
SELECT run_id FROM (
    SELECT * FROM (
        SELECT runs.run_id, runs.created_at FROM runs INDEXED BY runs_runnable
        LEFT JOIN leases ON leases.run_id = runs.run_id
        WHERE runs.status IN ('queued', 'running')
          AND (runs.status = 'running' OR runs.not_before IS NULL OR runs.not_before <= :now)
          AND (leases.run_id IS NULL OR leases.expires_at <= :now)
        ORDER BY runs.created_at, runs.run_id
        LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT runs.run_id, runs.created_at FROM runs INDEXED BY runs_wake_at
        LEFT JOIN leases ON leases.run_id = runs.run_id
        WHERE runs.wake_at <= :now
          AND NOT (runs.status IN ('queued', 'running')
                   AND (runs.status = 'running' OR runs.not_before IS NULL OR runs.not_before <= :now))
          AND (leases.run_id IS NULL OR leases.expires_at <= :now)
        ORDER BY runs.created_at, runs.run_id
        LIMIT :limit
    )
)
ORDER BY created_at, run_id
LIMIT :limit

-- name: tombstone_by_run
-- Retention (stores/_sqlite_retention.py): what a deleted run's id answers.
SELECT body FROM tombstones WHERE run_id = :run_id

-- name: tombstone_by_key
-- A start whose idempotency key was a deleted run's is refused with that run's tombstone.
SELECT run_id, body FROM tombstones WHERE idempotency_key = :idempotency_key

-- name: insert_tombstone
INSERT INTO tombstones (run_id, idempotency_key, body) VALUES (:run_id, :idempotency_key, :body)

-- name: delete_tombstone
DELETE FROM tombstones WHERE run_id = :run_id

-- name: delete_run_leases
DELETE FROM leases WHERE run_id = :run_id

-- name: delete_run_facts
DELETE FROM facts WHERE run_id = :run_id

-- name: delete_run
DELETE FROM runs WHERE run_id = :run_id

-- name: chain_versions
-- A chain name's kept versions, oldest first.
SELECT body FROM chain_versions WHERE name = :name ORDER BY ordinal

-- name: insert_chain_version
-- A new version, numbered after the name's newest, in the writer's BEGIN IMMEDIATE transaction
-- (so no other process numbers one between the read and the insert).
INSERT INTO chain_versions (name, ordinal, chain_hash, body) VALUES (:name, :ordinal, :chain_hash, :body)

-- name: every_chain_version
SELECT body FROM chain_versions ORDER BY name, ordinal

-- name: held_chain_hashes
-- The chain hash of every run (a clean-up keeps the versions runs hold).
SELECT DISTINCT json_extract(head, '$.chain_hash') FROM runs WHERE json_valid(head)

-- name: delete_chain_version
DELETE FROM chain_versions WHERE name = :name AND ordinal = :ordinal
