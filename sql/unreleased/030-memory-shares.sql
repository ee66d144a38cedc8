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
