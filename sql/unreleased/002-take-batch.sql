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
