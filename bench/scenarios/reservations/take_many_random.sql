\set k random(1, 100000)
SELECT allowed FROM rate_limit.take_many(ARRAY['bench', 'bench_b'], ARRAY['key' || :k]);
