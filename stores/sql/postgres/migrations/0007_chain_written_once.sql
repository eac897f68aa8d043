-- 0006: the chain snapshot written once (PostgreSQL).
--
-- A run's head carries its chain snapshot (steps and the specialists' personas: most of a head,
-- 10-20 KB for a long chain), and no fact ever changes it after the run's creation; yet every
-- append rewrote it with the head (issue 11). It moves to a column of its own, written by the
-- create only; appends write the head without it, and every read puts it back (the queries
-- load_head, list_runs, head_by_idempotency_key). The heads written before are split here.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS chain jsonb;
-- head::jsonb: a no-op on the JSONB column this migration meets, and what lets it run again (as
-- a test does) on the text column of migration 0010.
UPDATE runs SET chain = head::jsonb -> 'chain', head = head::jsonb - 'chain' WHERE head::jsonb ? 'chain';
