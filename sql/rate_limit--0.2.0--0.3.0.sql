-- rate_limit 0.2.0 -> 0.3.0 ("Run it in production"). Never edit it once 0.3.0 is listed in sql/RELEASED.
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.3.0'" to load this file. \quit

-- The write-limiting row trigger (src/api/triggers.rs), SECURITY DEFINER like take.
CREATE FUNCTION rate_limit."limit_writes"()
    RETURNS TRIGGER
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'limit_writes_wrapper';
ALTER FUNCTION rate_limit.limit_writes() SECURITY DEFINER;
COMMENT ON FUNCTION rate_limit.limit_writes() IS
    'Row trigger: limit_writes(policy, key_column [, cost]) takes cost tokens per written row from the '
    'bucket of the row''s key; a denied row raises 53400 with the RateLimit header values in DETAIL';

-- Statistics in shared memory (src/stats, src/api/stats.rs): the views' functions and the reset.
CREATE FUNCTION rate_limit."stats_rows"() RETURNS TABLE (
    "kind" TEXT,
    "policy" TEXT,
    "calls" bigint,
    "granted" bigint,
    "denied" bigint,
    "tokens_granted" bigint,
    "last_denial" timestamp with time zone,
    "since" timestamp with time zone
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_rows_wrapper';

CREATE FUNCTION rate_limit."top_limited_rows"() RETURNS TABLE (
    "kind" TEXT,
    "policy" TEXT,
    "rank" INT,
    "key" TEXT,
    "denials" bigint,
    "denials_min" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'top_limited_rows_wrapper';

CREATE FUNCTION rate_limit."reset_stats"(
    "policy" TEXT DEFAULT NULL
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_stats_wrapper';

CREATE VIEW rate_limit.stats AS
SELECT s.kind, s.policy, s.calls, s.granted, s.denied, s.tokens_granted, s.last_denial, s.since
FROM rate_limit.stats_rows() AS s;
COMMENT ON VIEW rate_limit.stats IS
    'Calls, grants, denials and tokens granted per policy (and for rate_limiting_request and ad-hoc limits) since "since"; owner only';

CREATE VIEW rate_limit.top_limited AS
SELECT t.kind, t.policy, t.rank, t.key, t.denials, t.denials_min
FROM rate_limit.top_limited_rows() AS t;
COMMENT ON VIEW rate_limit.top_limited IS
    'The most denied keys per policy: denied between denials_min and denials times (Space-Saving summary); owner only';

REVOKE ALL ON TABLE rate_limit.stats FROM PUBLIC;
REVOKE ALL ON TABLE rate_limit.top_limited FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.stats_rows() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.top_limited_rows() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset_stats(text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.stats_rows() IS 'Internal: the rows of rate_limit.stats';
COMMENT ON FUNCTION rate_limit.top_limited_rows() IS 'Internal: the rows of rate_limit.top_limited';
COMMENT ON FUNCTION rate_limit.reset_stats(text) IS
    'Zero the statistics and top limited keys of a policy, or of everything in this database (NULL); owner only';
