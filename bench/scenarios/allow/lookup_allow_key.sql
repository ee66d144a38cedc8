\set k random(1, 100000)
SELECT body FROM bench_docs WHERE id = :k AND rate_limit.allow('bench', :k);
