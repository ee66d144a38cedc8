\set k random(1, 100000)
SELECT baseline_rate_limiting_request('key' || :k, 2, 60);
