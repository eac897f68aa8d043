-- 0012: a create with an idempotency key in one statement (PostgreSQL; issue 24).
--
-- A keyed create must be refused when its key is a deleted run's (a tombstone), including a run
-- whose deletion commits while the create waits on the key's unique index: the check has to read
-- the tombstones *after* the insert, with a snapshot taken then. Until now that was a transaction
-- (BEGIN, the insert, the check, COMMIT: four round trips, and every start has a key, its retry
-- window's). A VOLATILE function takes a fresh snapshot for each statement it runs (READ
-- COMMITTED), so the create's statement calls this one on its inserted row: it reads the key's
-- tombstone as of that moment and, when there is one, raises SQLSTATE CX001 with the deleted run's
-- id as DETAIL and its tombstone as HINT, which aborts the statement (the run, its facts, lease and
-- notification are never written). Idempotent, like the migrations before it.
CREATE OR REPLACE FUNCTION construct_key_free(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    gone text;
    tomb text;
BEGIN
    SELECT t.run_id, t.body INTO gone, tomb FROM tombstones AS t WHERE t.idempotency_key = key;
    IF gone IS NOT NULL THEN
        RAISE EXCEPTION 'the idempotency key is a deleted run''s'
            USING ERRCODE = 'CX001', DETAIL = gone, HINT = tomb;
    END IF;
    RETURN true;
END
$$;
