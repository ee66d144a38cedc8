-- rate_limit 0.1.0 -> 0.2.0 ("One core for every call"). Released: never edit this file (sql/released.sha256).
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.2.0'" to load this file. \quit

-- 0.2.0 keeps every bucket of the table store in one table keyed (namespace, key): the buckets of
-- rate_limiting_request (0.1.0's bucket_state, keyed id) move to namespace '#request', the ad-hoc buckets
-- (0.1.0's policy_state with policy '') to '#ad_hoc', and policy buckets keep their policy's name. The
-- levels keep their meaning: a request bucket is the token bucket of refill_per_sec tokens per second
-- (level in millionths of a token = ticks of a one-second period), policy levels are unchanged.

-- Objects that depend on what changes go first; they are created again below.
DROP VIEW rate_limit.buckets;
DROP VIEW rate_limit.policy_buckets;
DROP TRIGGER policies_changed ON rate_limit.policies;

-- Functions 0.2.0 no longer has. rate_limit.take(...) with an array or ad-hoc limits became take_many and
-- take_ad_hoc (no overloading by type at one arity: drivers send untyped parameters); peek and reset of a
-- request bucket became peek_request and reset_request. A user object that depends on one of them makes
-- the update fail instead of being dropped with it.
DROP FUNCTION rate_limit.bucket_level_at(bigint, timestamptz, integer, bigint, timestamptz);
DROP FUNCTION rate_limit.level_after_take(bigint, timestamptz, integer, bigint, timestamptz, bigint);
DROP FUNCTION rate_limit.policy_state_is_full(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz);
DROP FUNCTION rate_limit.policy_state_tokens(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz);
DROP FUNCTION rate_limit.peek(text, integer, integer);
DROP FUNCTION rate_limit.reset(text);
DROP FUNCTION rate_limit.take(text, bigint, interval, bigint, integer);
DROP FUNCTION rate_limit.take(text[], text, integer);
DROP FUNCTION rate_limit.take(text[], text[], integer);
-- A new result type and a renamed argument: dropped and created again.
DROP FUNCTION rate_limit.memory_buckets();
DROP FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint, text, bigint,
    bigint, bigint, timestamptz, timestamptz, bigint);

-- The one state table, exactly as a fresh 0.2.0 install creates it, filled from the two old ones. 0.1.0's
-- request buckets wait in a temporary table while bucket_state is dropped and created again: renaming the
-- old table instead would keep its constraint names (PostgreSQL 18 names NOT NULL constraints too), and
-- the new table's would then differ from a fresh install's.
CREATE TEMPORARY TABLE request_buckets_0_1_0 AS
    SELECT id, level, updated_at, refill_per_sec, capacity FROM rate_limit.bucket_state;
DROP TABLE rate_limit.bucket_state;
CREATE TABLE rate_limit.bucket_state (
    namespace  text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,   -- byte-wise equality and the fastest comparisons
    level      bigint      NOT NULL,
    updated_at timestamptz NOT NULL,        -- server clock (clock_timestamp()) of the last grant
    algorithm  text        NOT NULL,        -- the numbers the level was written under
    rate       bigint      NOT NULL,
    per_us     bigint      NOT NULL,
    burst      bigint      NOT NULL,
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 70);
COMMENT ON TABLE rate_limit.bucket_state IS
    'rate_limit table store: one row per (namespace, key) bucket; read it through rate_limit.buckets';
INSERT INTO rate_limit.bucket_state (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
SELECT '#request', o.id, o.level, o.updated_at, 'token_bucket', o.refill_per_sec, 1000000, o.capacity
FROM pg_temp.request_buckets_0_1_0 AS o;
INSERT INTO rate_limit.bucket_state (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
SELECT CASE p.policy WHEN '' THEN '#ad_hoc' ELSE p.policy END, p.key, p.level, p.updated_at, p.algorithm,
       p.rate, p.per_us, p.burst
FROM rate_limit.policy_state AS p;
DROP TABLE pg_temp.request_buckets_0_1_0;
DROP TABLE rate_limit.policy_state;
REVOKE ALL ON TABLE rate_limit.bucket_state FROM PUBLIC;
COMMENT ON SCHEMA rate_limit IS 'rate_limit: bucket state, policies, the limiter API and its views';
COMMENT ON TYPE rate_limit.decision IS
    'Result of rate_limit.take / take_many / take_ad_hoc / peek / wait / refund: allowed, remaining, limit, retry_after, reset_after, policy';

-- Every function of 0.2.0. CREATE OR REPLACE keeps the privileges of the ones that existed and drops
-- their 0.1.0 SET search_path clause (0.2.0 qualifies every name instead).
CREATE OR REPLACE FUNCTION "rate_limiting_request"(
    "id" TEXT,
    "refill_per_sec" INT DEFAULT 2,
    "window_seconds" INT DEFAULT 60
) RETURNS INT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'rate_limiting_request_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."reset"(
    "policy" TEXT,
    "key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."peek"(
    "policy" TEXT,
    "key" TEXT
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'peek_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."wait"(
    "policy" TEXT,
    "key" TEXT,
    "cost" INT DEFAULT 1,
    "timeout" interval DEFAULT NULL
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'wait_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."headers"(
    "decision" rate_limit.decision,
    "policy" TEXT DEFAULT NULL
) RETURNS jsonb
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'headers_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."take"(
    "policy" TEXT,
    "key" TEXT,
    "cost" INT DEFAULT 1
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'take_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."take_ad_hoc"(
    "key" TEXT,
    "rate" bigint,
    "per" interval,
    "burst" bigint DEFAULT NULL,
    "cost" INT DEFAULT 1
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'take_ad_hoc_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."refund"(
    "policy" TEXT,
    "key" TEXT,
    "tokens" bigint
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'refund_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."reset_ad_hoc"(
    "key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_ad_hoc_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."take_many"(
    "policies" TEXT[],
    "keys" TEXT[],
    "cost" INT DEFAULT 1
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'take_many_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."state_after_take"(
    "level" bigint,
    "updated_at" timestamp with time zone,
    "algorithm" TEXT,
    "rate" bigint,
    "per_us" bigint,
    "burst" bigint,
    "new_algorithm" TEXT,
    "new_rate" bigint,
    "new_per_us" bigint,
    "new_burst" bigint,
    "changed_at" timestamp with time zone,
    "now" timestamp with time zone,
    "cost" bigint
) RETURNS bigint
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'state_after_take_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."memory_buckets"() RETURNS TABLE (
    "kind" TEXT,
    "policy" TEXT,
    "key" TEXT,
    "tokens" NUMERIC,
    "limit" bigint,
    "rate" bigint,
    "per" interval,
    "algorithm" TEXT,
    "updated_at" timestamp with time zone
)
STRICT VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'memory_buckets_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."state_tokens"(
    "level" bigint,
    "updated_at" timestamp with time zone,
    "algorithm" TEXT,
    "rate" bigint,
    "per_us" bigint,
    "burst" bigint,
    "at" timestamp with time zone
) RETURNS NUMERIC
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'state_tokens_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."memory_usage"() RETURNS TABLE (
    "max_buckets" bigint,
    "buckets" bigint,
    "partitions" bigint,
    "slots" bigint,
    "slot_bytes" bigint,
    "total_bytes" bigint,
    "bytes_per_bucket" bigint,
    "lossless_evictions" bigint,
    "lossy_evictions" bigint,
    "refused_full" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'memory_usage_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."effective_now"(
    "now" timestamp with time zone,
    "updated_at" timestamp with time zone
) RETURNS timestamp with time zone
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'effective_now_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."state_is_full"(
    "level" bigint,
    "updated_at" timestamp with time zone,
    "algorithm" TEXT,
    "rate" bigint,
    "per_us" bigint,
    "burst" bigint,
    "at" timestamp with time zone
) RETURNS bool
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'state_is_full_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."reset_request"(
    "id" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_request_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."tokens"(
    "id" TEXT,
    "refill_per_sec" INT DEFAULT 2,
    "window_seconds" INT DEFAULT 60
) RETURNS NUMERIC
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'tokens_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."peek_request"(
    "id" TEXT,
    "refill_per_sec" INT DEFAULT 2,
    "window_seconds" INT DEFAULT 60
) RETURNS bigint
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'peek_request_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."purge"() RETURNS bigint
STRICT VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'purge_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."alter_policy"(
    "name" TEXT,
    "rate" bigint DEFAULT NULL,
    "per" interval DEFAULT NULL,
    "burst" bigint DEFAULT NULL,
    "algorithm" TEXT DEFAULT NULL
) RETURNS VOID
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'alter_policy_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."drop_policy"(
    "name" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'drop_policy_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."create_policy"(
    "name" TEXT,
    "rate" bigint,
    "per" interval,
    "burst" bigint DEFAULT NULL,
    "algorithm" TEXT DEFAULT 'token_bucket',
    "store" TEXT DEFAULT NULL
) RETURNS VOID
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'create_policy_wrapper';

CREATE OR REPLACE FUNCTION rate_limit."policies_changed"()
    RETURNS TRIGGER
   
LANGUAGE c
    AS 'MODULE_PATHNAME', 'policies_changed_wrapper';

CREATE TRIGGER policies_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limit.policies
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limit.policies_changed();

-- Every bucket of both stores, with its tokens now (exact, rounded down to the millionth). kind is
-- 'policy', 'ad_hoc' or 'request'; policy is NULL unless kind = 'policy'. Memory-store keys longer than
-- 28 bytes end with an ellipsis.
CREATE VIEW rate_limit.buckets AS
SELECT CASE s.namespace WHEN '#request' THEN 'request' WHEN '#ad_hoc' THEN 'ad_hoc' ELSE 'policy' END AS kind,
       CASE WHEN s.namespace IN ('#request', '#ad_hoc') THEN NULL ELSE s.namespace END AS policy,
       s.key,
       rate_limit.state_tokens(s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst,
                               clock_timestamp()) AS tokens,
       s.burst AS "limit",
       s.rate,
       s.per_us * interval '1 microsecond' AS per,
       s.algorithm,
       s.updated_at,
       'table'::text AS store
FROM rate_limit.bucket_state AS s
UNION ALL
SELECT m.kind, m.policy, m.key, m.tokens, m."limit", m.rate, m.per, m.algorithm, m.updated_at, 'memory'::text
FROM rate_limit.memory_buckets() AS m;
COMMENT ON VIEW rate_limit.buckets IS
    'Buckets of both stores (policy, ad-hoc and rate_limiting_request) with their tokens now; full ones may be purged';

-- The privileges and comments of 0.2.0 (as its finalize script sets them).
REVOKE ALL ON TABLE rate_limit.buckets FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset_request(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset_ad_hoc(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.refund(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.purge() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.create_policy(text, bigint, interval, bigint, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.alter_policy(text, bigint, interval, bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.drop_policy(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.memory_buckets() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.effective_now(timestamptz, timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.state_tokens(bigint, timestamptz, text, bigint, bigint, bigint,
    timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.state_is_full(bigint, timestamptz, text, bigint, bigint, bigint,
    timestamptz) FROM PUBLIC;

COMMENT ON FUNCTION rate_limiting_request(text, integer, integer) IS
    'Take one token from bucket id (refill_per_sec tokens/s, capacity refill_per_sec * window_seconds); '
    'returns the whole tokens left, or -1 when denied';
COMMENT ON FUNCTION rate_limit.peek_request(text, integer, integer) IS
    'Whole tokens in rate_limiting_request''s bucket id now under the given limit; consumes nothing';
COMMENT ON FUNCTION rate_limit.tokens(text, integer, integer) IS
    'Tokens in rate_limiting_request''s bucket id now under the given limit, exact to the millionth';
COMMENT ON FUNCTION rate_limit.reset_request(text) IS
    'Delete rate_limiting_request''s bucket id, making it full; true if it existed; owner only';
COMMENT ON FUNCTION rate_limit.purge() IS
    'Delete every bucket of both stores that is full now (lossless); returns how many; owner only';
COMMENT ON FUNCTION rate_limit.take(text, text, integer) IS
    'Take cost tokens (0 only reports) from bucket key of a named policy; returns a rate_limit.decision';
COMMENT ON FUNCTION rate_limit.take_many(text[], text[], integer) IS
    'Take cost tokens under every policy, all or nothing: keys holds one key for all, or one per policy';
COMMENT ON FUNCTION rate_limit.take_ad_hoc(text, bigint, interval, bigint, integer) IS
    'Take cost tokens from bucket key under an ad-hoc token bucket: rate per per, at most burst';
COMMENT ON FUNCTION rate_limit.peek(text, text) IS 'The bucket of key under a policy, taking nothing';
COMMENT ON FUNCTION rate_limit.wait(text, text, integer, interval) IS
    'Sleep until cost tokens can be taken (or give up at timeout, taking nothing); returns the decision';
COMMENT ON FUNCTION rate_limit.refund(text, text, bigint) IS
    'Put tokens back into bucket key of a policy, capped at its burst; owner only';
COMMENT ON FUNCTION rate_limit.reset(text, text) IS 'Delete bucket key of a policy, making it full; owner only';
COMMENT ON FUNCTION rate_limit.reset_ad_hoc(text) IS 'Delete the ad-hoc bucket key, making it full; owner only';
COMMENT ON FUNCTION rate_limit.headers(rate_limit.decision, text) IS
    'RateLimit, RateLimit-Policy and Retry-After HTTP field values for a decision, as jsonb';
COMMENT ON FUNCTION rate_limit.create_policy(text, bigint, interval, bigint, text, text) IS
    'Create a named policy: rate tokens per per, at most burst; algorithm and store optional; owner only';
COMMENT ON FUNCTION rate_limit.alter_policy(text, bigint, interval, bigint, text) IS
    'Change a policy (NULL keeps a value); buckets carry their tokens over, never gaining any; owner only';
COMMENT ON FUNCTION rate_limit.drop_policy(text) IS 'Drop a policy and its table-store buckets; owner only';
COMMENT ON FUNCTION rate_limit.memory_usage() IS
    'Size and use of the memory store: buckets, slots, bytes per bucket, evictions';
COMMENT ON FUNCTION rate_limit.memory_buckets() IS 'Internal: buckets of the memory store, for rate_limit.buckets';
COMMENT ON FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint) IS
    'Internal: the level of a stored row after a take, or -1 if short (the table store''s UPDATE)';
COMMENT ON FUNCTION rate_limit.effective_now(timestamptz, timestamptz) IS
    'Internal: the instant a stored row is evaluated at (clock skew versus a clock step)';
COMMENT ON FUNCTION rate_limit.state_tokens(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz) IS
    'Internal: tokens of a stored row at a given time, exact to the millionth';
COMMENT ON FUNCTION rate_limit.state_is_full(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz) IS
    'Internal: whether a stored row is full at a given time';
