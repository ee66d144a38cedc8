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
    'Buckets of the memory store in this database (ids longer than 28 bytes end with an ellipsis); owner only';
COMMENT ON FUNCTION rate_limit.memory_usage() IS
    'Size and use of the memory store: buckets, slots, bytes per bucket, evictions';
COMMENT ON FUNCTION rate_limit.level_after_take(bigint, timestamptz, integer, bigint, timestamptz, bigint) IS
    'Level, in millionths of a token, of a stored bucket row after taking cost tokens at a given time; -1 if short';
COMMENT ON FUNCTION rate_limit.tokens(text, integer, integer) IS
    'Tokens in bucket id now under the given limit, exact to the millionth; consumes nothing';

-- ---- the full limiter API -------------------------------------------------------------------------------

CREATE TRIGGER policies_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limit.policies
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limit.policies_changed();

-- Policy and ad-hoc buckets of both stores, with their tokens now (exact, rounded down to the
-- millionth). policy is NULL for ad-hoc buckets.
CREATE VIEW rate_limit.policy_buckets AS
SELECT nullif(s.policy, '') AS policy,
       s.key,
       rate_limit.policy_state_tokens(s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst,
                                      clock_timestamp()) AS tokens,
       s.burst AS "limit",
       s.algorithm,
       s.updated_at,
       'table'::text AS store
FROM rate_limit.policy_state AS s
UNION ALL
SELECT m.policy, m.key, m.tokens, m."limit", m.algorithm, m.updated_at, 'memory'::text
FROM rate_limit.memory_policy_buckets() AS m;
COMMENT ON VIEW rate_limit.policy_buckets IS
    'Policy and ad-hoc buckets of both stores with their tokens now (memory keys are cut at 28 bytes); full ones may be purged';

GRANT SELECT ON TABLE rate_limit.policies TO PUBLIC;
REVOKE ALL ON TABLE rate_limit.policy_state FROM PUBLIC;
REVOKE ALL ON TABLE rate_limit.policy_buckets FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.create_policy(text, bigint, interval, bigint, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.alter_policy(text, bigint, interval, bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.drop_policy(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.memory_policy_buckets() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.refund(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset(text, text) FROM PUBLIC;

COMMENT ON FUNCTION rate_limit.take(text, text, integer) IS
    'Take cost tokens (0 only reports) from bucket key of a named policy; returns a rate_limit.decision';
COMMENT ON FUNCTION rate_limit.take(text, bigint, interval, bigint, integer) IS
    'Take cost tokens from bucket key under an ad-hoc token bucket: rate per per, at most burst';
COMMENT ON FUNCTION rate_limit.take(text[], text, integer) IS
    'Take cost tokens from bucket key under every policy, all or nothing';
COMMENT ON FUNCTION rate_limit.take(text[], text[], integer) IS
    'Take cost tokens from bucket keys[i] under policies[i] for every i, all or nothing';
COMMENT ON FUNCTION rate_limit.peek(text, text) IS 'The bucket of key under a policy, taking nothing';
COMMENT ON FUNCTION rate_limit.wait(text, text, integer, interval) IS
    'Sleep until cost tokens can be taken (or give up at timeout, taking nothing); returns the decision';
COMMENT ON FUNCTION rate_limit.refund(text, text, bigint) IS
    'Put tokens back into bucket key of a policy, capped at its burst; owner only';
COMMENT ON FUNCTION rate_limit.reset(text, text) IS 'Delete bucket key of a policy, making it full; owner only';
COMMENT ON FUNCTION rate_limit.headers(rate_limit.decision, text) IS
    'RateLimit, RateLimit-Policy and Retry-After HTTP field values for a decision, as jsonb';
COMMENT ON FUNCTION rate_limit.create_policy(text, bigint, interval, bigint, text, text) IS
    'Create a named policy: rate tokens per per, at most burst; algorithm and store optional; owner only';
COMMENT ON FUNCTION rate_limit.alter_policy(text, bigint, interval, bigint, text) IS
    'Change a policy (NULL keeps a value); buckets carry their tokens over, never gaining any; owner only';
COMMENT ON FUNCTION rate_limit.drop_policy(text) IS 'Drop a policy and its table-store buckets; owner only';

-- The multi-bucket statements of the table store join a VALUES list of the call's buckets with
-- rate_limit.policy_state. A generic plan made while the table is small (or not yet analyzed) can choose a
-- hash join over a sequential scan, which then costs O(table) per call as the table grows; with sequential
-- scans disabled during these calls the plan is always one primary-key lookup per bucket.
ALTER FUNCTION rate_limit.take(text[], text, integer) SET enable_seqscan = off;
ALTER FUNCTION rate_limit.take(text[], text[], integer) SET enable_seqscan = off;
ALTER FUNCTION rate_limit.refund(text, text, bigint) SET enable_seqscan = off;
