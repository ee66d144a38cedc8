-- rate_limit 0.3.0 -> 0.4.0 (the memory store closed to abuse). Never edit it once 0.4.0 is listed in
-- sql/RELEASED.
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.4.0'" to load this file. \quit

-- reset_stats(NULL) reset everything; now a NULL policy is 22004 and reset_stats() resets everything.
DROP FUNCTION rate_limit.reset_stats(text);
CREATE FUNCTION rate_limit."reset_stats"() RETURNS bigint
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_all_stats_wrapper';
CREATE FUNCTION rate_limit."reset_stats"(
    "policy" TEXT
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_stats_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.reset_stats(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset_stats() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.reset_stats(text) IS
    'Zero the statistics and top limited keys of a policy in this database; owner only';
COMMENT ON FUNCTION rate_limit.reset_stats() IS
    'Zero every statistic and top limited key of this database; owner only';

-- memory_usage() shows the current database's share of the memory store.
DROP FUNCTION rate_limit.memory_usage();
CREATE FUNCTION rate_limit."memory_usage"() RETURNS TABLE (
    "max_buckets" bigint,
    "buckets" bigint,
    "partitions" bigint,
    "slots" bigint,
    "slot_bytes" bigint,
    "total_bytes" bigint,
    "bytes_per_bucket" bigint,
    "lossless_evictions" bigint,
    "lossy_evictions" bigint,
    "refused_full" bigint,
    "share_percent" bigint,
    "share_buckets" bigint,
    "database_buckets" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'memory_usage_wrapper';
COMMENT ON FUNCTION rate_limit.memory_usage() IS
    'Size and use of the memory store: buckets, slots, bytes per bucket, evictions, this database''s share';

-- Every database's buckets in the memory store, for operators.
CREATE FUNCTION rate_limit."memory_shares"() RETURNS TABLE (
    "database" TEXT,
    "buckets" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'memory_shares_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.memory_shares() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.memory_shares() IS
    'Buckets each database holds in the memory store; owner only';
