\set k random(1, 100000)
SELECT allowed FROM rate_limit.book('bench_ahead', 'key' || :k, 2);
