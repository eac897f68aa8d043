-- 0002: the runs' wake_at (SQLite).
--
-- wake_at is the earliest deadline of a non-terminal run (the run's own, or the task in progress's):
-- the time at which the run needs a decision although nobody wrote to it. runnable and
-- claim_runnable hand out runs whose wake_at passed, so that a deadline that passes while a run is
-- paused, or while no server was up, is still recorded. The column is NULL for terminal runs (the
-- adapter writes it so), which keeps the index to the runs that can still wake. Like every time
-- column here it is stores._common.sortable_time text: 'YYYY-MM-DDTHH:MM:SS.ffffffZ'.
ALTER TABLE runs ADD COLUMN wake_at TEXT;

-- Backfill from the heads written before this migration. Heads hold UTC times as pydantic writes
-- them ('...T..:..:..Z' or '...T..:..:...123456Z'), which are rewritten exactly; anything else goes
-- through strftime, which normalizes an offset to UTC but keeps only milliseconds.
UPDATE runs
SET wake_at = CASE
    WHEN json_extract(head, '$.wake_at') GLOB '????-??-??T??:??:??Z'
        THEN substr(json_extract(head, '$.wake_at'), 1, 19) || '.000000Z'
    WHEN json_extract(head, '$.wake_at') GLOB '????-??-??T??:??:??.*Z'
        THEN substr(json_extract(head, '$.wake_at'), 1, 20)
            || substr(
                substr(json_extract(head, '$.wake_at'), 21, length(json_extract(head, '$.wake_at')) - 21)
                    || '000000',
                1,
                6
            )
            || 'Z'
    ELSE strftime('%Y-%m-%dT%H:%M:%f', json_extract(head, '$.wake_at')) || '000Z'
END
WHERE json_extract(head, '$.wake_at') IS NOT NULL
  AND status NOT IN ('completed', 'completed_with_failures', 'failed', 'cancelled', 'rejected');

-- Due runs: a range scan over the few runs that have a deadline at all.
CREATE INDEX runs_wake_at ON runs (wake_at) WHERE wake_at IS NOT NULL;
