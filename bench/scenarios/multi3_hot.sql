SELECT allowed FROM rate_limit.take_many(ARRAY['bench', 'bench_b', 'bench_c'], ARRAY['hot']);
