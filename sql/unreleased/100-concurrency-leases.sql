-- Concurrency leases: acquire and release.
CREATE FUNCTION rate_limit."acquire"(
    "policy" TEXT,
    "key" TEXT
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'acquire_wrapper';
COMMENT ON FUNCTION rate_limit.acquire(text, text) IS
    'Acquire a lease of key under a concurrency policy: the decision, with the lease id when allowed';
CREATE FUNCTION rate_limit."release"(
    "policy" TEXT,
    "key" TEXT,
    "lease" bigint
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_wrapper';
COMMENT ON FUNCTION rate_limit.release(text, text, bigint) IS
    'Release a lease acquired with rate_limit.acquire: true if it was held and is now free';
