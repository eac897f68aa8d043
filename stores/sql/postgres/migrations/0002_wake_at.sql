-- 0002: the runs' wake_at (PostgreSQL).
--
-- wake_at is the earliest deadline of a non-terminal run (the run's own, or the task in progress's):
-- the time at which the run needs a decision although nobody wrote to it. runnable and
-- claim_runnable hand out runs whose wake_at passed, so that a deadline that passes while a run is
-- paused, or while no server was up, is still recorded. The column is NULL for terminal runs (the
-- adapter writes it so), which keeps the index to the runs that can still wake.
ALTER TABLE runs ADD COLUMN wake_at timestamptz;

-- Backfill from the heads written before this migration (the head JSON has carried wake_at since
-- the deadlines were introduced; a head without it has no deadline).
UPDATE runs SET wake_at = (head ->> 'wake_at')::timestamptz
WHERE head ->> 'wake_at' IS NOT NULL
  AND status NOT IN ('completed', 'completed_with_failures', 'failed', 'cancelled', 'rejected');

-- Due runs: a range scan over the few runs that have a deadline at all.
CREATE INDEX runs_wake_at ON runs (wake_at) WHERE wake_at IS NOT NULL;
