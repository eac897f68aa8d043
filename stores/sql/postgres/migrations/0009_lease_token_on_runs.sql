-- 0009: the lease token kept on the run's row too (PostgreSQL; issue 11).
--
-- An append is fenced by the drive's lease token. It was checked against the lease row, locked
-- FOR SHARE in the append's statement after the run row (two row locks, each written to the WAL,
-- at every task boundary). The token a claim hands out is now also written to runs.lease_token in
-- the claim's statement, and cleared by a release, so that the append's compare-and-swap checks it
-- in the WHERE of the one UPDATE it makes anyway: a claim committed while the append waited for
-- the run row is seen, as READ COMMITTED re-checks an updated row's latest version. The leases
-- table stays what it was (owner, expiry, token); every statement that changes a lease's token
-- writes runs.lease_token in the same statement, locking the run row first (claim_lease,
-- claim_runnable, release_lease: stores/sql/postgres/queries.sql), so the two always agree.
-- Leases held when this migration runs keep their tokens. Idempotent, like the migrations before it.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS lease_token text;
UPDATE runs SET lease_token = leases.token FROM leases WHERE leases.run_id = runs.run_id;
