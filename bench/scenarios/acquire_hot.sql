SELECT allowed FROM rate_limit.acquire('bench_jobs', 'hot');
