-- Named queries of the postgres adapter (stores/postgres.py). Parameters are positional ($1, ...).
-- Tables are unqualified: every connection's search_path is the store's schema.

-- name: create_schema_statement
-- The schema is an identifier, which cannot be a parameter: let the server quote it.
SELECT format('CREATE SCHEMA IF NOT EXISTS %I', $1::text)

-- name: schema_lock
-- Held until the transaction ends: concurrent migrators create the schema and apply each migration
-- once (CREATE SCHEMA IF NOT EXISTS alone still fails when two sessions race). Keyed by the schema
-- name, not current_schema(), which is NULL until the schema exists.
SELECT pg_advisory_xact_lock(hashtext('construct-mcp schema ' || $1::text))

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migrations_table_exists
SELECT to_regclass('schema_migrations') IS NOT NULL

-- name: schema_version
SELECT coalesce(max(version), 0) FROM schema_migrations

-- name: record_migration
INSERT INTO schema_migrations (version, name) VALUES ($1, $2)

-- name: insert_run
-- DO NOTHING covers both the run id and the idempotency key; it waits for a concurrent insert of the
-- same key to commit, so the caller's follow-up read of the key sees the winner.
INSERT INTO runs (run_id, version, status, created_at, updated_at, not_before, idempotency_key, head, wake_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9)
ON CONFLICT DO NOTHING
RETURNING run_id

-- name: head_by_idempotency_key
SELECT run_id, head::text FROM runs WHERE idempotency_key = $1

-- name: insert_facts
-- All the facts of one write in one statement (one round trip).
INSERT INTO facts (run_id, seq, type, body)
SELECT $1, f.seq, f.type, f.body::jsonb
FROM unnest($2::integer[], $3::text[], $4::text[]) AS f (seq, type, body)

-- name: append_facts
-- The facts of an append, in one statement, inserted only if they continue the log: the fact
-- before the first ($5) exists. The command tag says how many were inserted (none otherwise).
INSERT INTO facts (run_id, seq, type, body)
SELECT $1, f.seq, f.type, f.body::jsonb
FROM unnest($2::integer[], $3::text[], $4::text[]) AS f (seq, type, body)
WHERE EXISTS (SELECT 1 FROM facts AS p WHERE p.run_id = $1 AND p.seq = $5)

-- name: update_head
-- The compare-and-swap: no row changes unless the stored version is the one the writer read.
UPDATE runs
SET version = $3, status = $4, updated_at = $5, not_before = $6, head = $7::jsonb, wake_at = $8
WHERE run_id = $1 AND version = $2
RETURNING run_id

-- name: notify_runnable
-- Sent inside the write's transaction, so listeners hear of it only once it is committed.
SELECT pg_notify($1, $2)

-- name: run_version
SELECT version FROM runs WHERE run_id = $1

-- name: load_head
SELECT head::text FROM runs WHERE run_id = $1

-- name: read_facts
-- LIMIT NULL is "no limit".
SELECT seq, body::text FROM facts WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3

-- name: read_fact
SELECT seq, body::text FROM facts WHERE run_id = $1 AND seq = $2

-- name: list_runs
-- Keyset pagination, newest first; "no cursor" passes a key after every real one.
SELECT run_id, created_at, head::text FROM runs
WHERE (created_at, run_id) < ($1, $2)
ORDER BY created_at DESC, run_id DESC
LIMIT $3

-- name: list_runs_by_status
SELECT run_id, created_at, head::text FROM runs
WHERE status = ANY ($4::text[])
  AND (created_at, run_id) < ($1, $2)
ORDER BY created_at DESC, run_id DESC
LIMIT $3

-- name: runnable
-- Two disjoint sets, each read through its own index and each limited: the active runs (due queued
-- ones and running ones, from runs_runnable, already in order) and the other runs whose wake_at
-- passed (a range scan of runs_wake_at, sorted: there are only ever a few). Disjoint, so UNION ALL
-- needs no de-duplication.
SELECT run_id FROM (
    (SELECT run_id, created_at FROM runs
     WHERE status IN ('queued', 'running')
       AND (status = 'running' OR not_before IS NULL OR not_before <= $1)
     ORDER BY created_at, run_id
     LIMIT $2)
    UNION ALL
    (SELECT run_id, created_at FROM runs
     WHERE wake_at <= $1
       AND NOT (status IN ('queued', 'running')
                AND (status = 'running' OR not_before IS NULL OR not_before <= $1))
     ORDER BY created_at, run_id
     LIMIT $2)
) AS due
ORDER BY created_at, run_id
LIMIT $2

-- name: claim_lease
-- Take the lease if it is free, expired or already ours, with a new token ($5, which fences the
-- previous holder, even when that is us). ON CONFLICT DO UPDATE locks the existing lease row and
-- judges the WHERE on its latest committed version, so of two concurrent claimers exactly one gets a
-- row back.
INSERT INTO leases (run_id, owner, expires_at, token) VALUES ($1, $2, $3, $5)
ON CONFLICT (run_id) DO UPDATE
SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, token = EXCLUDED.token
WHERE leases.expires_at <= $4 OR leases.owner = EXCLUDED.owner
RETURNING run_id

-- name: renew_lease
-- Only while the lease carries the caller's token (expired or not: nobody claimed it since).
UPDATE leases SET expires_at = $3 WHERE run_id = $1 AND token = $2 RETURNING run_id

-- name: release_lease
DELETE FROM leases WHERE run_id = $1 AND token = $2

-- name: lock_lease
-- The fence of an append, after its compare-and-swap UPDATE (so the run row is locked first, in the
-- order claim_runnable locks them too, and the two cannot deadlock). FOR SHARE makes a concurrent
-- claim of this lease wait for the append to commit; a claim that committed first is seen (READ
-- COMMITTED re-checks the locked row's latest version), so no claim can slip in between the check
-- and the commit.
SELECT 1 FROM leases WHERE run_id = $1 AND token = $2 FOR SHARE

-- name: lease_token
-- Which error a refused append gets: the lease is gone (lease_lost) or only the version moved.
SELECT token FROM leases WHERE run_id = $1

-- name: claim_runnable
-- Claim up to $4 runnable runs (as runnable defines them) whose lease is free or expired, oldest
-- first (a run this owner already holds is being worked on: it is not handed out again). SKIP LOCKED
-- lets concurrent claimers (other processes) pass over the runs this one is taking instead of waiting
-- for them. NO KEY UPDATE (not UPDATE) so that the lease insert's foreign-key check, which takes a
-- KEY SHARE lock on the run, cannot deadlock against a concurrent claim_lease. The upsert re-checks
-- the lease on its latest version, so a lease committed after this statement's snapshot still wins.
-- Each claimed lease gets a new random token (a gen_random_uuid, built in since PostgreSQL 13: 122
-- random bits, as hex).
WITH candidates AS (
    SELECT runs.run_id, runs.created_at
    FROM runs
    LEFT JOIN leases ON leases.run_id = runs.run_id
    WHERE (
        (runs.status IN ('queued', 'running')
         AND (runs.status = 'running' OR runs.not_before IS NULL OR runs.not_before <= $3))
        OR runs.wake_at <= $3
      )
      AND (leases.run_id IS NULL OR leases.expires_at <= $3)
    ORDER BY runs.created_at, runs.run_id
    LIMIT $4
    FOR NO KEY UPDATE OF runs SKIP LOCKED
)
INSERT INTO leases (run_id, owner, expires_at, token)
SELECT run_id, $1, $2, replace(gen_random_uuid()::text, '-', '') FROM candidates ORDER BY created_at, run_id
ON CONFLICT (run_id) DO UPDATE
SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, token = EXCLUDED.token
WHERE leases.expires_at <= $3
RETURNING run_id, token

-- name: tombstone_by_run
-- Retention (stores/_postgres_retention.py): what a deleted run's id answers.
SELECT body FROM tombstones WHERE run_id = $1

-- name: tombstone_by_key
-- A start whose idempotency key was a deleted run's is refused with that run's tombstone.
SELECT run_id, body FROM tombstones WHERE idempotency_key = $1

-- name: insert_tombstone
INSERT INTO tombstones (run_id, idempotency_key, body) VALUES ($1, $2, $3)

-- name: delete_tombstone
DELETE FROM tombstones WHERE run_id = $1

-- name: lock_head
-- A deletion's check: the head, its row locked until the deletion commits, so an append's
-- compare-and-swap waits for it and then finds no row.
SELECT head::text FROM runs WHERE run_id = $1 FOR UPDATE

-- name: delete_run_leases
DELETE FROM leases WHERE run_id = $1

-- name: delete_run_facts
DELETE FROM facts WHERE run_id = $1

-- name: delete_run
DELETE FROM runs WHERE run_id = $1
