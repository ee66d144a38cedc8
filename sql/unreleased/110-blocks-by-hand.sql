-- Blocks by hand (owner only).
CREATE FUNCTION rate_limit."block"(
    "policy" TEXT,
    "key" TEXT,
    "duration" interval
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'block_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.block(text, text, interval) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.block(text, text, interval) IS
    'Block key under a policy for duration: its calls are denied without touching its bucket; owner only';
CREATE FUNCTION rate_limit."unblock"(
    "policy" TEXT,
    "key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'unblock_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.unblock(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.unblock(text, text) IS
    'Lift the block of key under a policy and forget its penalty box count; true if it was blocked; owner only';
