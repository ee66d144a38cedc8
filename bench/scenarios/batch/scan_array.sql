SELECT count(*) FILTER (WHERE k IS NOT NULL) FROM bench_batch, unnest(bench_batch.keys) k;
