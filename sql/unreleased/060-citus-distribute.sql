-- Citus: rate_limit.distribute() sets a cluster up (src/cluster/citus.rs).
CREATE FUNCTION rate_limit."distribute"(
	"shard_count" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"object" TEXT,  /* String */
	"action" TEXT  /* String */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'distribute_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.distribute(integer) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.distribute(integer) IS
    'On a Citus coordinator: policies as a reference table, state distributed by key, keyed calls delegated '
    'to the key''s node; idempotent; owner only';
