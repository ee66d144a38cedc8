\set k random(1, 100000)
SELECT d.body FROM bench_docs AS d, rate_limit.take('bench', 'key' || :k) AS t WHERE d.id = :k AND t.allowed;
