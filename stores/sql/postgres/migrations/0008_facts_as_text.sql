-- 0008: fact bodies stored as text, without the foreign key to runs (PostgreSQL; issue 11).
--
-- Every append inserts its facts; the JSONB column parsed each body into JSONB's binary form and
-- the foreign key ran a trigger per fact that looked the run up again, although no query reads a
-- body as JSON (reads hand it back as text: read_facts, read_fact) and the append inserts facts
-- only for the run row its compare-and-swap just locked and updated. Both were a good part of the
-- append's server time. Bodies are now kept as the JSON text the adapter writes (still with U+0000
-- escaped: see stores/_jsonb.py); the bodies written before are rewritten here as JSONB prints
-- them, which reads back as the same JSON. Facts are still only ever inserted with their run: by
-- create and import in the transaction that inserts the run row, by append for the row it locked;
-- a deletion removes the facts before the run row, under that row's lock.
ALTER TABLE facts DROP CONSTRAINT IF EXISTS facts_run_id_fkey;
ALTER TABLE facts ALTER COLUMN body TYPE text USING body::text;
