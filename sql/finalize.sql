-- rate_limit finalize: runs last in CREATE EXTENSION. The view, the privileges and the comments.

-- Every bucket of the table store, refilled to the moment of the query.
CREATE VIEW rate_limit.buckets AS
SELECT s.id,
       (rate_limit.bucket_level_at(s.level, s.updated_at, s.refill_per_sec, s.capacity, clock_timestamp())
            ::numeric / 1000000)::numeric(20, 6) AS tokens,
       s.capacity,
       s.refill_per_sec,
       s.updated_at,
       'table'::text AS store
FROM rate_limit.bucket_state AS s
UNION ALL
SELECT m.id,
       (m.level::numeric / 1000000)::numeric(20, 6),
       m.capacity,
       m.refill_per_sec,
       m.updated_at,
       'memory'::text
FROM rate_limit.memory_buckets() AS m;
COMMENT ON VIEW rate_limit.buckets IS
    'Buckets of both stores with their tokens now (exact, to the millionth); full buckets may be purged';

-- Security model: any role may ask for and inspect tokens; only the extension owner (and roles it grants)
-- may reset, purge or read the list of ids. The storage table is not accessible to PUBLIC at all: the
-- functions that use it are SECURITY DEFINER with search_path pinned to pg_catalog, pg_temp.
GRANT USAGE ON SCHEMA rate_limit TO PUBLIC;
REVOKE ALL ON TABLE rate_limit.bucket_state FROM PUBLIC;
REVOKE ALL ON TABLE rate_limit.buckets FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.purge() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.memory_buckets() FROM PUBLIC;

COMMENT ON FUNCTION rate_limiting_request(text, integer, integer) IS
    'Take one token from bucket id (refill_per_sec tokens/s, capacity refill_per_sec * window_seconds); '
    'returns the whole tokens left, or -1 when denied';
COMMENT ON FUNCTION rate_limit.peek(text, integer, integer) IS
    'Whole tokens in bucket id now under the given limit; consumes nothing';
COMMENT ON FUNCTION rate_limit.reset(text) IS 'Delete bucket id, making it full; true if it existed';
COMMENT ON FUNCTION rate_limit.purge() IS 'Delete every bucket that is full now (lossless); returns how many';
COMMENT ON FUNCTION rate_limit.bucket_level_at(bigint, timestamptz, integer, bigint, timestamptz) IS
    'Level, in millionths of a token, of a stored bucket row at a given time';
COMMENT ON FUNCTION rate_limit.memory_buckets() IS
    'Buckets of the memory store in this database (ids longer than 36 bytes end with an ellipsis); owner only';
COMMENT ON FUNCTION rate_limit.memory_usage() IS
    'Size and use of the memory store: buckets, slots, bytes per bucket, evictions';
COMMENT ON FUNCTION rate_limit.level_after_take(bigint, timestamptz, integer, bigint, timestamptz, bigint) IS
    'Level, in millionths of a token, of a stored bucket row after taking cost tokens at a given time; -1 if short';
COMMENT ON FUNCTION rate_limit.tokens(text, integer, integer) IS
    'Tokens in bucket id now under the given limit, exact to the millionth; consumes nothing';
