\set k random(1, 100000)
SELECT coalesce(lease, 0) AS id FROM rate_limit.reserve('bench', 'key' || :k, hold => '1 second', amounts => '{"input": 2}') \gset
SELECT allowed FROM rate_limit.settle('bench', 'key' || :k, :id, amounts => '{"input": 1, "output": 0}');
