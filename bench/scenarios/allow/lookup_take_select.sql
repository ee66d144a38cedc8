\set k random(1, 100000)
SELECT d.body, (rate_limit.take('bench', 'key' || :k)).allowed FROM bench_docs AS d WHERE d.id = :k;
