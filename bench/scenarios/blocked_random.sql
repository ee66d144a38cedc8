\set k random(1, 10000)
SELECT allowed FROM rate_limit.take('bench_blocked', 'key' || :k);
