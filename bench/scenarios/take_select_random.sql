\set k random(1, 100000)
SELECT (rate_limit.take('bench', 'key' || :k)).allowed;
