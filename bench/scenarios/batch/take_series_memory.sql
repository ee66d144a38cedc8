SELECT count(*) FILTER (WHERE d.allowed) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench_wide_memory', 'key' || g) d;
