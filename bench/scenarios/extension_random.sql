\set k random(1, 100000)
SELECT rate_limiting_request('key' || :k, 2, 60);
