-- 0004: lease tokens (PostgreSQL).
--
-- A lease is a fence (orchestration/store.py): every claim writes a new random token; renewals and
-- releases match it, and an append a drive makes is accepted only while the run's lease still
-- carries the drive's token (checked in the append's transaction, under a lock on the lease row).
-- Leases held when this migration runs get the empty token, which no claim ever hands out: they
-- fence every writer, and expire or are claimed again as before.
ALTER TABLE leases ADD COLUMN token text NOT NULL DEFAULT '';
