SELECT count(*) FILTER (WHERE allowed) FROM bench_batch, rate_limit.take_batch('bench_wide_memory', bench_batch.keys);
