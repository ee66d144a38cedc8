-- Citus: on the coordinator the statistics views merge every node's own rows, which these give
-- (src/cluster/merged.rs).
CREATE FUNCTION rate_limit."node_top_limited_rows"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"policy" TEXT,  /* Option < String > */
	"rank" INT,  /* i32 */
	"key" TEXT,  /* String */
	"denials" bigint,  /* i64 */
	"denials_min" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'node_top_limited_rows_wrapper';
CREATE FUNCTION rate_limit."node_stats_rows"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"policy" TEXT,  /* Option < String > */
	"calls" bigint,  /* i64 */
	"granted" bigint,  /* i64 */
	"denied" bigint,  /* i64 */
	"tokens_granted" bigint,  /* i64 */
	"last_denial" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"since" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'node_stats_rows_wrapper';
CREATE FUNCTION rate_limit."node_memory_buckets"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"policy" TEXT,  /* Option < String > */
	"key" TEXT,  /* String */
	"tokens" NUMERIC,  /* AnyNumeric */
	"limit" bigint,  /* i64 */
	"rate" bigint,  /* i64 */
	"per" interval,  /* Option < Interval > */
	"algorithm" TEXT,  /* String */
	"updated_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE SECURITY DEFINER PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'node_memory_buckets_rows_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.node_stats_rows() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.node_top_limited_rows() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.node_memory_buckets() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.node_stats_rows() IS
    'This node''s own rows of rate_limit.stats (on a Citus coordinator the view merges every node''s); owner only';
COMMENT ON FUNCTION rate_limit.node_top_limited_rows() IS
    'This node''s own rows of rate_limit.top_limited (on a Citus coordinator the view merges every node''s); owner only';
COMMENT ON FUNCTION rate_limit.node_memory_buckets() IS
    'This node''s own memory-store buckets (on a Citus coordinator rate_limit.buckets lists every node''s); owner only';
