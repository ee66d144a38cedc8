-- The PL/pgSQL rate limiter rate_limit replaces, written by us from its public contract
-- (../shared/reference/README.md), for benchmarks and comparison tests. Not part of the extension.
-- Its defects are kept on purpose: integer tokens (fractional refill rounded away), a write on every
-- denial, now() mixed with clock_timestamp(), and a possible unique_violation on concurrent creation.

CREATE TABLE IF NOT EXISTS baseline_rate_limit (
    id text PRIMARY KEY,
    tk bigint NOT NULL,
    ts timestamptz NOT NULL
);

CREATE OR REPLACE FUNCTION baseline_rate_limiting_request(
    rate_id text, refill_per_sec int DEFAULT 2, window_seconds int DEFAULT 60)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    remaining bigint;
BEGIN
    UPDATE baseline_rate_limit
       SET tk = greatest(least(tk - 1 + refill_per_sec * extract(epoch FROM clock_timestamp() - ts),
                               window_seconds * refill_per_sec), -1),
           ts = now()
     WHERE id = rate_id
    RETURNING tk INTO remaining;
    IF NOT FOUND THEN
        INSERT INTO baseline_rate_limit (id, tk, ts)
        VALUES (rate_id, window_seconds * refill_per_sec - 1, clock_timestamp())
        RETURNING tk INTO remaining;
    END IF;
    RETURN remaining;
END
$$;
