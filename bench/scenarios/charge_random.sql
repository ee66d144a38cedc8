\set k random(1, 100000)
SELECT allowed FROM rate_limit.charge('bench_charge', 'key' || :k, 1);
