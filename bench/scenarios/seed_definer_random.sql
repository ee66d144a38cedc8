\set k random(1, 100000)
SELECT rate_limit.bench_seed_definer('key' || :k, 2, 60);
