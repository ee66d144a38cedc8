\set k random(1, 100000)
SELECT rate_limit.release('bench_adaptive', 'key' || :k, a.lease, 'ok', interval '2 seconds') FROM rate_limit.acquire('bench_adaptive', 'key' || :k) AS a WHERE a.allowed;
