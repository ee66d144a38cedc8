-- memory_usage() shows the current database's and login role's shares of the memory store.
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
    "database_buckets" bigint,
    "role_share_percent" bigint,
    "role_share_buckets" bigint,
    "role_buckets" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'memory_usage_wrapper';
COMMENT ON FUNCTION rate_limit.memory_usage() IS
    'Size and use of the memory store: buckets, slots, bytes per bucket, evictions, this database''s and this role''s shares';
