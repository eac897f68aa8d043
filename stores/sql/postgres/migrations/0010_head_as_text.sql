-- 0010: heads stored as text (PostgreSQL; issue 11).
--
-- Every append rewrites the run's head (about 5 KB of JSON at the end of a 50-step chain, without
-- the chain snapshot). As JSONB, the server parsed it into JSONB's binary form at every append:
-- about 75 us of the append's server time for that head, measured, at every task boundary. No query
-- reads into a head (the adapter reads it back whole, as text), so it is now kept as the JSON text
-- the adapter writes, still with U+0000 escaped (stores/_jsonb.py), like fact bodies (0008). The
-- heads written before are rewritten here as JSONB prints them, which reads back as the same JSON.
-- The chain snapshot keeps its JSONB column (written once, at creation); reads put it back into the
-- head's text as its last key, as the SQLite store does. A change of type drops the column's
-- compression method, so lz4 (0006) is set again, where the server has it.
ALTER TABLE runs ALTER COLUMN head TYPE text USING head::text;
DO $$
BEGIN
    EXECUTE 'ALTER TABLE runs ALTER COLUMN head SET COMPRESSION lz4';
EXCEPTION
    WHEN feature_not_supported OR syntax_error OR invalid_parameter_value THEN
        RAISE NOTICE 'lz4 compression is not available: heads keep the default compression';
END
$$;
