\set k random(1, 100000)
SELECT allowed FROM rate_limit.take('bench_child', 'key' || :k);
