\set id random(1, 100000)
SELECT a.name, d.allowed FROM bench_accounts a, LATERAL rate_limit.take('bench_wide_memory', a.name) d WHERE a.id = :id;
