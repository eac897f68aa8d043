-- 0011: a claim reads only its candidates (PostgreSQL; issue 24).
--
-- claim_runnable walked every active run in age order (runs_runnable) and probed each one's lease:
-- with thousands of runs in flight, all leased, one claim made thousands of lease lookups to find
-- none. The runs it may claim are now found through two small indexes instead:
--
-- * a free run — active, no lease token on its row (the token every claim writes to the run row,
--   and every release clears: migration 0009) — through a partial index of exactly those runs,
--   oldest first, so that LIMIT stops at the first candidates;
-- * a run whose lease expired (its holder died or stalled) through an index of the leases by
--   expiry: a range scan of the expired ones only, however many leases are live.
--
-- (A run whose deadline passed while it had no lease is found through runs_wake_at, as before.)
-- Idempotent, like the migrations before it.
CREATE INDEX IF NOT EXISTS runs_claimable ON runs (created_at, run_id)
    WHERE status IN ('queued', 'running') AND lease_token IS NULL;
CREATE INDEX IF NOT EXISTS leases_expires_at ON leases (expires_at);
