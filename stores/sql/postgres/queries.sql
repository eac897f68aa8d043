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

-- name: initialize_lock
-- A session lock around the first start's look at the schema and its migrations, so that a process
-- starting while another initializes the same fresh schema waits for it instead of finding it half made.
SELECT pg_advisory_lock(hashtext('construct-mcp initialize ' || $1::text))

-- name: initialize_unlock
SELECT pg_advisory_unlock(hashtext('construct-mcp initialize ' || $1::text))

-- name: schema_has_tables
-- Anything in the schema (a table, view, sequence of ours or not): a schema with nothing in it is
-- fresh, and opening it creates ours (nothing can be lost); anything else needs `construct-mcp migrate`.
SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1::text)

-- name: schema_version
SELECT coalesce(max(version), 0) FROM schema_migrations

-- name: record_migration
INSERT INTO schema_migrations (version, name) VALUES ($1, $2)

-- name: insert_run
-- DO NOTHING covers both the run id and the idempotency key; it waits for a concurrent insert of the
-- same key to commit, so the caller's follow-up read of the key sees the winner.
INSERT INTO runs (run_id, version, status, created_at, updated_at, not_before, idempotency_key, head, wake_at, chain)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb)
ON CONFLICT DO NOTHING
RETURNING run_id

-- name: create_run
-- A create's writes in one statement: the run row (insert_run), its facts (insert_facts), when $16
-- is set a lease on it (token $16, for owner $17 until $18: a run this process drives at once,
-- CreatesClaimed; the token is on the run row too, as a claim writes it) and, when $15 is set, the
-- notification that it is runnable (notify_runnable; sent once the statement's transaction
-- commits). Parameters: $1-$10 as insert_run, $11-$13 the facts (seq, type, body), $14 the NOTIFY
-- channel, $15 whether to notify, $16-$18 the lease or three NULLs. inserted = 0: the run id or
-- the idempotency key was taken (nothing is written). With an idempotency key, the inserted row
-- is then checked against the tombstones by construct_key_free (migration 0012), which reads them
-- with a snapshot of its own, taken after the insert, and aborts the statement with SQLSTATE CX001
-- when the key is a deleted run's (see stores/_postgres_retention.py). One round trip either way
-- (autocommit).
WITH inserted AS (
    INSERT INTO runs (run_id, version, status, created_at, updated_at, not_before, idempotency_key, head, wake_at, chain, lease_token)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $16::text)
    ON CONFLICT DO NOTHING
    RETURNING run_id, idempotency_key
),
key_free AS (
    SELECT construct_key_free(inserted.idempotency_key) FROM inserted WHERE inserted.idempotency_key IS NOT NULL
),
facts_in AS (
    INSERT INTO facts (run_id, seq, type, body)
    SELECT inserted.run_id, f.seq, f.type, f.body
    FROM inserted, unnest($11::integer[], $12::text[], $13::text[]) AS f (seq, type, body)
    RETURNING 1
),
leased AS (
    INSERT INTO leases (run_id, owner, expires_at, token)
    SELECT inserted.run_id, $17::text, $18::timestamptz, $16::text FROM inserted WHERE $16::text IS NOT NULL
    RETURNING 1
),
notified AS (
    SELECT pg_notify($14, inserted.run_id) FROM inserted WHERE $15::boolean
)
SELECT (SELECT count(*) FROM inserted) AS inserted, (SELECT count(*) FROM facts_in) AS facts,
       (SELECT count(*) FROM leased) AS leased, (SELECT count(*) FROM notified) AS notified,
       (SELECT count(*) FROM key_free) AS key_free

-- name: head_by_idempotency_key
SELECT run_id, CASE WHEN chain IS NULL THEN head ELSE left(head, -1) || ',"chain":' || chain::text || '}' END FROM runs WHERE idempotency_key = $1

-- name: find_by_idempotency_key
-- The run holding a key, else the tombstone of the deleted run that held it, in one statement (one
-- round trip, one snapshot): the run's id and head and two NULLs, or two NULLs and the tombstone's
-- run id and body, or four NULLs when neither exists.
SELECT r.run_id,
       CASE WHEN r.chain IS NULL THEN r.head ELSE left(r.head, -1) || ',"chain":' || r.chain::text || '}' END,
       t.run_id,
       t.body
FROM (SELECT $1::text AS key) AS k
LEFT JOIN runs AS r ON r.idempotency_key = k.key
LEFT JOIN tombstones AS t ON r.run_id IS NULL AND t.idempotency_key = k.key
LIMIT 1

-- name: insert_facts
-- All the facts of one write in one statement (one round trip).
INSERT INTO facts (run_id, seq, type, body)
SELECT $1, f.seq, f.type, f.body
FROM unnest($2::integer[], $3::text[], $4::text[]) AS f (seq, type, body)

-- name: append
-- An append in one statement, so one round trip committed by autocommit's implicit transaction:
-- the compare-and-swap of the head, the lease fence and the insert of the facts, with a notify when
-- the write carries no lease (an external event: a cancel, an approval, a host's output, which the
-- drive of the run, on whichever server, must hear of at once, and which may leave it runnable). A
-- drive's own write (fenced) tells nobody, even when it leaves the run queued: no other server can
-- claim the run while its lease holds, and the release that lets go of a runnable run notifies
-- (release_lease). Every run's last task leaves it queued for its run_finished write: that
-- notification woke every other server's dispatcher for a claim that found nothing, 6,592 claims
-- in bench/scale.py's target scenario. Parameters: $1 run id, $2 expected version, $3-$8 the new head's columns,
-- $9 the lease token (NULL: not fenced), $10-$12 the facts (seq, type, body), $13 the seq of the
-- fact the first one follows, $14 the NOTIFY channel.
--
-- It locks one row, the run's, by updating it: the fence is the token on that row (migration
-- 0009), which every claim writes in its own statement after locking the same row. An append that
-- waits for a claim's lock re-checks the WHERE on the row the claim committed (READ COMMITTED), so
-- a token replaced meanwhile refuses it. The UPDATE changes the row only if the version, the fence
-- and the continuation of the log all hold; otherwise nothing is written, the row returned says 0
-- facts inserted, and the adapter reads why (append_refused).
WITH cas AS (
    UPDATE runs
    SET version = $3, status = $4, updated_at = $5, not_before = $6, head = $7, wake_at = $8
    WHERE run_id = $1 AND version = $2
      AND ($9::text IS NULL OR lease_token = $9)
      AND EXISTS (SELECT 1 FROM facts AS p WHERE p.run_id = $1 AND p.seq = $13)
    RETURNING run_id
),
inserted AS (
    INSERT INTO facts (run_id, seq, type, body)
    SELECT cas.run_id, f.seq, f.type, f.body
    FROM cas, unnest($10::integer[], $11::text[], $12::text[]) AS f (seq, type, body)
    RETURNING seq
),
notified AS (
    -- Sent inside the statement's transaction: listeners hear of it only once it is committed.
    SELECT pg_notify($14, cas.run_id) FROM cas WHERE $9::text IS NULL
)
SELECT (SELECT count(*) FROM inserted) AS inserted,
       (SELECT count(*) FROM notified) AS notified

-- name: update_chain
-- The chain of a run an append moves to another chain (chain_upgraded): in one transaction with that
-- append, after it; no other append writes the chain. $1 run id, $2 the chain.
UPDATE runs SET chain = $2::jsonb WHERE run_id = $1

-- name: append_refused
-- Why an append wrote nothing, read after it (the run's version and lease token now, whether its
-- log has the fact the append's first one follows): $1 run id, $2 that fact's seq. No row: the run
-- is gone.
SELECT version, lease_token, EXISTS (SELECT 1 FROM facts WHERE run_id = $1 AND seq = $2)
FROM runs WHERE run_id = $1

-- name: notify_runnable
-- Sent inside the write's transaction, so listeners hear of it only once it is committed.
SELECT pg_notify($1, $2)

-- name: run_version
SELECT version FROM runs WHERE run_id = $1

-- name: lease_of
-- The run's lease as stored, expired or not (ReadsLeases.lease_of): $1 the run id. A read.
SELECT owner, expires_at, token FROM leases WHERE run_id = $1

-- name: run_versions
-- The versions of many runs in one statement (RunStore.versions): $1 the run ids.
SELECT run_id, version FROM runs WHERE run_id = ANY ($1::text[])

-- name: load_head
-- The head as written (JSON text since migration 0010), with the chain snapshot written once at
-- creation put back in as its last key (see migration chain_written_once); a head that holds its
-- own chain is read as it is.
SELECT CASE WHEN chain IS NULL THEN head ELSE left(head, -1) || ',"chain":' || chain::text || '}' END FROM runs WHERE run_id = $1

-- name: read_facts
-- LIMIT NULL is "no limit".
SELECT seq, body FROM facts WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3

-- name: read_fact
SELECT seq, body FROM facts WHERE run_id = $1 AND seq = $2

-- name: list_runs
-- Keyset pagination, newest first; "no cursor" passes a key after every real one.
SELECT run_id, created_at, CASE WHEN chain IS NULL THEN head ELSE left(head, -1) || ',"chain":' || chain::text || '}' END FROM runs
WHERE (created_at, run_id) < ($1, $2)
ORDER BY created_at DESC, run_id DESC
LIMIT $3

-- name: list_runs_by_status
SELECT run_id, created_at, CASE WHEN chain IS NULL THEN head ELSE left(head, -1) || ',"chain":' || chain::text || '}' END FROM runs
WHERE status = ANY ($4::text[])
  AND (created_at, run_id) < ($1, $2)
ORDER BY created_at DESC, run_id DESC
LIMIT $3

-- name: runnable
-- Two disjoint sets, each read through its own index and each limited: the active runs (due queued
-- ones and running ones, from runs_runnable, already in order) and the other runs whose wake_at
-- passed (a range scan of runs_wake_at, sorted: there are only ever a few). Disjoint, so UNION ALL
-- needs no de-duplication. Only the runs this server can read: $3 the highest record format it
-- reads (see runs_need_newer for how a head's format is read in SQL).
SELECT run_id FROM (
    (SELECT run_id, created_at FROM runs
     WHERE status IN ('queued', 'running')
       AND (status = 'running' OR not_before IS NULL OR not_before <= $1)
       AND coalesce(substring(encode(substring(convert_to(head, 'UTF8') from octet_length(head) - 23), 'escape')
                              from '"format":([0-9]{1,9})}$')::integer, 1) <= $3
     ORDER BY created_at, run_id
     LIMIT $2)
    UNION ALL
    (SELECT run_id, created_at FROM runs
     WHERE wake_at <= $1
       AND NOT (status IN ('queued', 'running')
                AND (status = 'running' OR not_before IS NULL OR not_before <= $1))
       AND coalesce(substring(encode(substring(convert_to(head, 'UTF8') from octet_length(head) - 23), 'escape')
                              from '"format":([0-9]{1,9})}$')::integer, 1) <= $3
     ORDER BY created_at, run_id
     LIMIT $2)
) AS due
ORDER BY created_at, run_id
LIMIT $2

-- name: claim_lease
-- Take the lease if it is free, expired or already ours, with a new token ($5, which fences the
-- previous holder, even when that is us). The run row is locked first, as every statement that
-- writes a token locks it (no two of them can deadlock), and the token is written to it too: the
-- append's fence (migration 0009). ON CONFLICT DO UPDATE locks the existing lease row and judges
-- the WHERE on its latest committed version, so of two concurrent claimers exactly one gets a
-- row back. found = false: no such run.
WITH run AS MATERIALIZED (
    SELECT run_id FROM runs WHERE run_id = $1 FOR NO KEY UPDATE
),
claimed AS (
    INSERT INTO leases (run_id, owner, expires_at, token) SELECT run_id, $2, $3, $5 FROM run
    ON CONFLICT (run_id) DO UPDATE
    SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, token = EXCLUDED.token
    WHERE leases.expires_at <= $4 OR leases.owner = EXCLUDED.owner
    RETURNING run_id, token
),
fenced AS (
    UPDATE runs SET lease_token = claimed.token FROM claimed WHERE runs.run_id = claimed.run_id
    RETURNING runs.run_id
)
SELECT EXISTS (SELECT 1 FROM run) AS found, (SELECT count(*) FROM fenced) AS claimed

-- name: renew_lease
-- Only while the lease carries the caller's token (expired or not: nobody claimed it since).
UPDATE leases SET expires_at = $3 WHERE run_id = $1 AND token = $2 RETURNING run_id

-- name: renew_leases
-- renew_lease for many leases in one statement: $1 the run ids, $2 their tokens, in the same order.
UPDATE leases SET expires_at = $3
FROM unnest($1::text[], $2::text[]) AS held(run_id, token)
WHERE leases.run_id = held.run_id AND leases.token = held.token
RETURNING leases.run_id

-- name: release_lease
-- The run row first (see claim_lease): its token cleared, then the lease row deleted; when the
-- run is left runnable now (as a claim's free runs are, judged with the database's clock: a hint),
-- the notification that it is ($3 the NOTIFY channel), so that another server's dispatcher claims
-- it at once rather than at its poll (a drive that stopped with its run unfinished: a shutdown).
WITH released AS (
    UPDATE runs SET lease_token = NULL WHERE run_id = $1 AND lease_token = $2
    RETURNING run_id, status IN ('queued', 'running')
        AND (status = 'running' OR not_before IS NULL OR not_before <= now()) AS runnable
),
dropped AS (
    DELETE FROM leases USING released WHERE leases.run_id = released.run_id AND leases.token = $2
),
notified AS (
    SELECT pg_notify($3, run_id) FROM released WHERE runnable
)
SELECT (SELECT count(*) FROM notified) AS notified

-- name: claim_runnable
-- Claim up to $4 runnable runs (as runnable defines them) whose lease is free or expired, oldest
-- first (a run this owner already holds is being worked on: it is not handed out again). The
-- candidates are read through indexes that hold only candidates (migration 0011), never by probing
-- the lease of every active run: the free active runs (no lease token on the row) in age order from
-- runs_claimable; the runs whose lease expired, a range scan of leases_expires_at (at most $4, the
-- longest expired first), each one's run looked up by its key; the runs without a lease whose
-- deadline passed, a range scan of runs_wake_at. The expired ones are found from the leases side on
-- purpose: joined the other way (the planner's choice while its statistics were of young leases),
-- a claim read the index entry of every active run, 7.5 ms with 4,000 runs in flight in
-- bench/scale.py; and a bitmap scan never marks the index entries that lease renewals left dead,
-- which the plain index scan does once (1.3 ms). Each set is locked as it is read, and
-- the oldest $4 of their union are claimed (the few extra rows locked are skipped by others until
-- this statement commits). SKIP LOCKED lets concurrent claimers (other processes) pass over the runs
-- this one is taking instead of waiting for them; a row another claim changed meanwhile is
-- re-checked on its latest version (READ COMMITTED), so a token written since excludes it. NO KEY
-- UPDATE (not UPDATE) so that the lease insert's foreign-key check, which takes a KEY SHARE lock on
-- the run, cannot deadlock against a concurrent claim_lease. The upsert re-checks the lease on its
-- latest version, so a lease committed after this statement's snapshot still wins. Each claimed
-- lease gets a new random token (a gen_random_uuid, built in since PostgreSQL 13: 122 random bits,
-- as hex), written to the run row too (the append's fence, migration 0009), found by its key: the
-- runs claimed are given as an array, since planned as a join with up to $4 claimed rows the update
-- hashed the whole runs table (2 ms for 4 runs claimed with 4,000 in flight). Only the runs this
-- server can read are claimed: $5 the highest record format it reads (see runs_need_newer). During a
-- rolling deploy an older server leaves a newer one's runs alone instead of claiming them, failing
-- to load them (record_too_new) and claiming them again at its next pass. The format is checked on
-- the candidates' rows as each index scan returns them, before they are locked: there are few of
-- them, except on an older server while no newer one takes the runs it leaves (it then reads the
-- head of each at every claim). The expired leases are limited before their runs are checked, so
-- an older server may miss an expired run it reads behind $4 it does not: a newer server takes it.
WITH free AS (
    SELECT run_id, created_at FROM runs
    WHERE status IN ('queued', 'running') AND lease_token IS NULL
      AND (status = 'running' OR not_before IS NULL OR not_before <= $3)
      AND coalesce(substring(encode(substring(convert_to(head, 'UTF8') from octet_length(head) - 23), 'escape')
                             from '"format":([0-9]{1,9})}$')::integer, 1) <= $5
    ORDER BY created_at, run_id
    LIMIT $4
    FOR NO KEY UPDATE SKIP LOCKED
),
expired AS (
    SELECT lapsed_run.run_id, lapsed_run.created_at
    FROM (SELECT run_id FROM leases WHERE expires_at <= $3 ORDER BY expires_at LIMIT $4) AS lapsed
    CROSS JOIN LATERAL (
        SELECT run_id, created_at FROM runs
        WHERE runs.run_id = lapsed.run_id
          AND ((runs.status IN ('queued', 'running')
                AND (runs.status = 'running' OR runs.not_before IS NULL OR runs.not_before <= $3))
               OR runs.wake_at <= $3)
          AND coalesce(substring(encode(substring(convert_to(runs.head, 'UTF8') from octet_length(runs.head) - 23), 'escape')
                                 from '"format":([0-9]{1,9})}$')::integer, 1) <= $5
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS lapsed_run
    ORDER BY lapsed_run.created_at, lapsed_run.run_id
    LIMIT $4
),
woken AS (
    SELECT run_id, created_at FROM runs
    WHERE wake_at <= $3 AND lease_token IS NULL
      AND coalesce(substring(encode(substring(convert_to(head, 'UTF8') from octet_length(head) - 23), 'escape')
                             from '"format":([0-9]{1,9})}$')::integer, 1) <= $5
    ORDER BY created_at, run_id
    LIMIT $4
    FOR NO KEY UPDATE SKIP LOCKED
),
candidates AS (
    SELECT run_id, created_at FROM free
    UNION SELECT run_id, created_at FROM expired
    UNION SELECT run_id, created_at FROM woken
    ORDER BY created_at, run_id
    LIMIT $4
),
claimed AS (
    INSERT INTO leases (run_id, owner, expires_at, token)
    SELECT run_id, $1, $2, replace(gen_random_uuid()::text, '-', '') FROM candidates ORDER BY created_at, run_id
    ON CONFLICT (run_id) DO UPDATE
    SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, token = EXCLUDED.token
    WHERE leases.expires_at <= $3
    RETURNING run_id, token
),
fenced AS (
    UPDATE runs SET lease_token = claimed.token FROM claimed
    WHERE runs.run_id = ANY (ARRAY(SELECT run_id FROM claimed)) AND runs.run_id = claimed.run_id
)
SELECT run_id, token FROM claimed

-- name: runs_need_newer
-- How many runs in the statuses $1 (the live ones) state a record format newer than $2, the highest
-- this server reads: the runs it leaves to a newer server (runnable, claim_runnable). A startup
-- read, once per open: it reads the head of every live run.
--
-- A head's format, here and in those queries, is read from the end of its text: the adapter writes
-- every head with "format" as its last key (stores/_common.py, encode_head), so a head ends with
-- "format":<n>}. A head that does not counts as format 1, as a record without a format does: none
-- is written so now, and the heads migration 0010 converted from JSONB (keys in JSONB's order)
-- were written by servers older than any that reads this schema. The last 24 bytes are taken as
-- bytes, escaped to text ('escape': a multibyte character cut in two cannot fail the conversion),
-- and matched anchored: right(head, 24) counts the characters of the whole head first, which made
-- the check about 2.4 times as costly (13 us against 5 us for a 2.5 KB head, lz4-compressed), and
-- more for longer heads. substring(... from n) runs to the end, so the tail ends at the head's end
-- in any server encoding.
SELECT count(*) FROM runs
WHERE status = ANY ($1::text[])
  AND coalesce(substring(encode(substring(convert_to(head, 'UTF8') from octet_length(head) - 23), 'escape')
                         from '"format":([0-9]{1,9})}$')::integer, 1) > $2

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
SELECT CASE WHEN chain IS NULL THEN head ELSE left(head, -1) || ',"chain":' || chain::text || '}' END FROM runs WHERE run_id = $1 FOR UPDATE

-- name: delete_run_leases
DELETE FROM leases WHERE run_id = $1

-- name: delete_run_facts
DELETE FROM facts WHERE run_id = $1

-- name: delete_run
DELETE FROM runs WHERE run_id = $1

-- name: chain_versions
-- A chain name's kept versions, oldest first.
SELECT body FROM chain_versions WHERE name = $1 ORDER BY ordinal

-- name: insert_chain_version
-- A new version, numbered by the caller after the name's newest while it holds lock_chain_name.
INSERT INTO chain_versions (name, ordinal, chain_hash, body) VALUES ($1, $2, $3, $4)

-- name: lock_chain_name
-- Serializes the keeps of one chain name across servers until the transaction ends, so that two
-- never number two versions alike (a concurrent keep of the same snapshot then finds the first).
SELECT pg_advisory_xact_lock(hashtext('construct_chain_versions'), hashtext($1))

-- name: every_chain_version
SELECT body FROM chain_versions ORDER BY name, ordinal

-- name: held_chain_hashes
-- The chain hash of every run (a clean-up keeps the versions runs hold): a full scan, for a
-- clean-up only. Read from the text (a head's first "chain_hash" key is its own: a string value
-- cannot hold that sequence unescaped), since a head may hold what jsonb refuses (\u0000).
SELECT DISTINCT substring(head from '"chain_hash":"([0-9a-f]+)"') FROM runs

-- name: delete_chain_version
DELETE FROM chain_versions WHERE name = $1 AND ordinal = $2
