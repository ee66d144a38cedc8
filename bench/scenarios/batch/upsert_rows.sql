INSERT INTO bench_rows (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
SELECT 'bench', k, 1, clock_timestamp(), 'token_bucket', 1, 1000000, 1000000 FROM bench_batch, unnest(bench_batch.keys) k
ON CONFLICT (namespace, key) DO UPDATE SET level = bench_rows.level + 1, updated_at = excluded.updated_at;
