-- 0003: texts holding U+0000 (PostgreSQL).
--
-- JSONB cannot hold U+0000, so the adapter now stores it as U+E000 followed by '0', and a U+E000 of
-- the data as U+E000 twice (stores/postgres.py, to_jsonb_text / from_jsonb_text). Rows written
-- before could not hold U+0000 at all; only their U+E000 characters need escaping so that they
-- read back unchanged. chr(57344) is U+E000.
UPDATE facts SET body = replace(body::text, chr(57344), chr(57344) || chr(57344))::jsonb
WHERE strpos(body::text, chr(57344)) > 0;

UPDATE runs SET head = replace(head::text, chr(57344), chr(57344) || chr(57344))::jsonb
WHERE strpos(head::text, chr(57344)) > 0;
