-- rate_limit 0.4.0 -> 0.5.0. Assembled by scripts/assemble-upgrade.sh from sql/unreleased/*.sql,
-- one fragment per change: edit those, then assemble again. Frozen once 0.5.0 is in sql/RELEASED.
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.5.0'" to load this file. \quit

-- rate_limit.nodes_of(keys): under Citus, the node that holds each key (#31).
CREATE FUNCTION rate_limit."nodes_of"(
	"keys" TEXT[]
) RETURNS TABLE (
	"key" TEXT,
	"host" TEXT,
	"port" INT,
	"shard" bigint
)
STABLE SECURITY DEFINER PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'nodes_of_wrapper';
COMMENT ON FUNCTION rate_limit.nodes_of(text[]) IS
    'Under Citus, the node (host, port) and shard that hold each key, in the order given: where to send its calls';

-- rate_limit.take_batch(policy, keys, costs, all_or_nothing): decisions for many keys in one statement (#31).
CREATE FUNCTION rate_limit."take_batch"(
	"policy" TEXT,
	"keys" TEXT[],
	"costs" INT[] DEFAULT NULL,
	"all_or_nothing" bool DEFAULT false
) RETURNS TABLE (
	"ordinality" INT,
	"key" TEXT,
	"allowed" bool,
	"remaining" bigint,
	"retry_after" interval
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'take_batch_wrapper';
COMMENT ON FUNCTION rate_limit.take_batch(text, text[], integer[], boolean) IS
    'Take costs[i] tokens (1 each by default) from bucket keys[i] of a policy for every key in order; one row per key';
