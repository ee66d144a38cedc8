SELECT allowed FROM rate_limit.take(ARRAY['bench', 'bench_b', 'bench_c'], 'hot');
