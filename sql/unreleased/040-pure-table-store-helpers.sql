-- The table store's helpers are pure (the caller passes its clock reading) and IMMUTABLE, so that Citus can
-- route the table store's UPDATE to a key's shard. state_after_take gets a new C symbol (0.3.0's read the
-- clock; the library keeps that symbol, refusing with 55000 until this update) and a last argument, where
-- a calendar window opened by the take ends.
-- effective_now is gone: the UPDATE takes GREATEST(now, updated_at) and the caller rebases after a step.
DROP FUNCTION rate_limit.effective_now(timestamptz, timestamptz);
DROP FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint);
CREATE FUNCTION rate_limit."state_after_take"(
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
    "cost" bigint,
    "window_end" timestamp with time zone
) RETURNS bigint
STRICT IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'state_after_take_at_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint, timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint, timestamptz) IS
    'Internal: the level of a stored row after a take, or -1 if short (the table store''s UPDATE)';
ALTER FUNCTION rate_limit.state_tokens(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz)
    IMMUTABLE;
ALTER FUNCTION rate_limit.state_is_full(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz)
    IMMUTABLE;
