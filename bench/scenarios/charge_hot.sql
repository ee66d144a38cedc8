SELECT allowed FROM rate_limit.charge('bench_charge', 'hot', 1);
