\set k random(1, 100000)
SELECT coalesce(lease, 0) AS id FROM rate_limit.reserve_many(ARRAY['bench', 'bench_b'], 'key' || :k, ARRAY[1], '1 second') \gset
SELECT allowed FROM rate_limit.settle_many(ARRAY['bench', 'bench_b'], 'key' || :k, :id, ARRAY[1]);
