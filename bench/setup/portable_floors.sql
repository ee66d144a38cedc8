-- Floors for bench/run.sh portable, installed by the portable database's owner (a role without superuser),
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

-- Random keys: bench_seed_definer, the seed's function (bench/setup/baseline.sql) as a portable edition must run,
-- SECURITY DEFINER owned by a role without superuser over its own table (rate_limit.bench_seed_state), is
-- made from bench/setup/baseline.sql by bench/run.sh portable, so that it stays the seed's function.
