\set k random(1, 100000)
SELECT allowed FROM rate_limit.reserve_many(ARRAY['bench', 'bench_b'], 'key' || :k, ARRAY[1], '1 second');
