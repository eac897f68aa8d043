-- 0004: the chain snapshot written once (SQLite).
--
-- A run's head carries its chain snapshot (steps and the specialists' personas: most of a head,
-- 10-20 KB for a long chain), and no fact ever changes it after the run's creation; yet every
-- append rewrote it with the head (issue 11). It moves to a column of its own, written by the
-- create only; appends write the head without it, and every read puts it back (the queries
-- load_head, list_runs, head_by_idempotency_key). The heads written before are split here (a head
-- that is not JSON is left as it is: it stays unreadable, as it was).
ALTER TABLE runs ADD COLUMN chain TEXT;

UPDATE runs
SET chain = json_extract(head, '$.chain'), head = json_remove(head, '$.chain')
WHERE CASE WHEN json_valid(head) THEN json_type(head, '$.chain') = 'object' ELSE 0 END;
