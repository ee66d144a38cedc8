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
