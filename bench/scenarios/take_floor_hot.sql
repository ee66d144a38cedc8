SELECT allowed FROM rate_limit.bench_take_floor('bench', 'hot');
