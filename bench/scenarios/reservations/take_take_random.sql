\set k random(1, 100000)
SELECT allowed FROM rate_limit.take('bench', 'key' || :k);
SELECT allowed FROM rate_limit.take('bench', 'key' || :k);
