-- Floors for bench/run_portable.sh, installed by the portable database's owner (a role without superuser),
-- as the portable edition is. Not part of rate_limit: each is the least a role-safe PL/pgSQL function can do
-- for one of the goals, to show how far any portable implementation could go on the machine of the run.

-- take's hot key: read the policy's numbers and the bucket (one statement, as take's fast path does) and
-- return a decision without computing anything in it.
CREATE FUNCTION rate_limit.bench_take_floor(policy text, key text, cost integer DEFAULT 1)
RETURNS rate_limit.decision LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    d rate_limit.decision;
BEGIN
    SELECT false, s.level, f.burst, NULL, NULL, policy, false, NULL INTO d
      FROM rate_limit._fast_policies AS f
      LEFT JOIN rate_limit.bucket_state AS s
        ON s.namespace OPERATOR(pg_catalog.=) f.name AND s.key OPERATOR(pg_catalog.=) bench_take_floor.key
     WHERE f.name OPERATOR(pg_catalog.=) bench_take_floor.policy;
    RETURN d;
END
$$;

-- Random keys: the seed's function (bench/baseline.sql) as a portable edition must run, SECURITY DEFINER
-- owned by a role without superuser over a table closed to its callers: one UPDATE, no argument checks,
-- rounding arithmetic.
CREATE TABLE rate_limit.bench_seed_state (id text PRIMARY KEY, tk bigint NOT NULL, ts timestamptz NOT NULL);
CREATE FUNCTION rate_limit.bench_seed_definer(rate_id text, refill_per_sec int DEFAULT 2, window_seconds int DEFAULT 60)
RETURNS int LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    remaining bigint;
BEGIN
    UPDATE rate_limit.bench_seed_state
       SET tk = greatest(least(tk - 1 + refill_per_sec * extract(epoch FROM clock_timestamp() - ts),
                               window_seconds * refill_per_sec), -1),
           ts = now()
     WHERE id = rate_id
    RETURNING tk INTO remaining;
    IF NOT FOUND THEN
        INSERT INTO rate_limit.bench_seed_state (id, tk, ts)
        VALUES (rate_id, window_seconds * refill_per_sec - 1, clock_timestamp())
        RETURNING tk INTO remaining;
    END IF;
    RETURN remaining;
END
$$;
