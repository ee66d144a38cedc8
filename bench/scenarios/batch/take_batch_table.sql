SELECT count(*) FILTER (WHERE allowed) FROM bench_batch, rate_limit.take_batch('bench_wide_table', bench_batch.keys);
