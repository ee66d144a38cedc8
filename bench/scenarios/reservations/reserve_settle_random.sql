\set k random(1, 100000)
SELECT coalesce(lease, 0) AS id FROM rate_limit.reserve('bench', 'key' || :k, 1, '1 second') \gset
SELECT allowed FROM rate_limit.settle('bench', 'key' || :k, :id, 1);
