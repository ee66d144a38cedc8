\set k random(1, 100000)
SELECT allowed FROM rate_limit.reserve('bench', 'key' || :k, 1, '1 second');
