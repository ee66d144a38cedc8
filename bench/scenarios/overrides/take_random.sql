\set k random(1, 1000000)
SELECT allowed FROM rate_limit.take(:policy, 'key' || :k);
