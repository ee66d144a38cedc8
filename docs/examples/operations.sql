-- The monitoring examples of docs/operations.md, run on a fresh database with the extension (as its owner,
-- library preloaded, default settings). Every block of docs/operations.md marked
-- `<!-- example: operations-... -->` is this file's output: scripts/doc-examples.py --write regenerates them,
-- and the tests fail when they differ. The lines before the first block fill the statistics.
SELECT rate_limit.create_policy('api', 100, '1 minute');
SELECT rate_limit.create_policy('sign_ups', 5, '1 hour', store => 'table');
SET rate_limit.store = 'memory';
-- one client far over its limit, two a little over, many within it
SELECT count(*) FILTER (WHERE allowed) AS granted, count(*) FILTER (WHERE NOT allowed) AS denied
FROM generate_series(1, 550) AS g,
     LATERAL rate_limit.take('api', CASE WHEN g <= 450 THEN '203.0.113.7'
                                         WHEN g <= 490 THEN '198.51.100.2'
                                         WHEN g <= 500 THEN '192.0.2.99'
                                         ELSE '10.0.0.' || g END, CASE WHEN g <= 450 THEN 1 ELSE 3 END);
SELECT count(*) FROM generate_series(1, 220) AS g WHERE rate_limiting_request('user' || (g % 2), 1, 60) >= 0;
SELECT count(*) FROM generate_series(1, 12) AS g, LATERAL rate_limit.take('sign_ups', 'ip' || g);
--@ block operations-stats
SELECT kind, policy, calls, granted, denied, tokens_granted,
       round(100.0 * denied / nullif(calls, 0), 1) AS denied_pct, last_denial IS NOT NULL AS has_denials
FROM rate_limit.stats ORDER BY denied DESC;

SELECT policy, rank, key, denials, denials_min FROM rate_limit.top_limited
WHERE policy = 'api' AND rank <= 3 ORDER BY rank;
--@ block operations-memory
SELECT max_buckets, share_buckets, database_buckets, lossy_evictions, refused_full
FROM rate_limit.memory_usage();
--@ block operations-worker
SELECT backend_type, datname FROM pg_stat_activity WHERE backend_type = 'rate_limit launcher';
--@ block operations-metrics
SELECT kind, policy, calls, granted, denied, shadow_denied, blocked FROM rate_limit.metrics ORDER BY kind, policy;

SELECT policy, algorithm, rate, period_seconds, burst, shadow FROM rate_limit.metrics_policies ORDER BY policy;
