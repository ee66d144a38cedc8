\set k random(1, 100000)
SELECT rate_limit.allow('bench', 'key' || :k);
