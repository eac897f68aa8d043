-- 0006: chain versions (SQLite).
--
-- Every distinct snapshot of a chain name the server has seen, numbered per name from 1 in the
-- order first seen (its configuration file's chains, and the lists of specialists tool calls
-- start runs with), so that a run can name its version and be moved to another. A version is data
-- beside the runs: a run keeps its own copy of its snapshot. body is the version as JSON.
CREATE TABLE IF NOT EXISTS chain_versions (
    name TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    chain_hash TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (name, ordinal),
    UNIQUE (name, chain_hash)
);
