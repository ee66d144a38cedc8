SELECT allowed FROM rate_limit.take('bench_month', 'hot');
