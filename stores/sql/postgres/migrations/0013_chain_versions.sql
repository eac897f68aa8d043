-- 0013: chain versions (PostgreSQL).
--
-- Every distinct snapshot of a chain name the servers sharing the schema have seen, numbered per
-- name from 1 in the order first seen (their configuration files' chains, and the lists of
-- specialists tool calls start runs with), so that a run can name its version and be moved to
-- another. A version is data beside the runs: a run keeps its own copy of its snapshot. body is the
-- version as JSON text. Idempotent, like the migrations before it.
CREATE TABLE IF NOT EXISTS chain_versions (
    name text NOT NULL,
    ordinal integer NOT NULL,
    chain_hash text NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (name, ordinal),
    UNIQUE (name, chain_hash)
);
