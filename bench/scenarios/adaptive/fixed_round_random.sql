\set k random(1, 100000)
SELECT rate_limit.release('bench_fixed', 'key' || :k, a.lease, 'ok', interval '1 millisecond') FROM rate_limit.acquire('bench_fixed', 'key' || :k) AS a WHERE a.allowed;
