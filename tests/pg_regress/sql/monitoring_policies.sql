-- Monitoring, the policies' numbers: rate_limit.metrics_policies, read by a role that is only in
-- pg_monitor (the role a Prometheus exporter runs as): each policy's rate, period and burst as gauges, and
-- for a concurrency policy the leases held now (counted by their rows, never per call); for an adaptive one
-- (a latency_target) the keys its calls' reports have cut below its most, and how far.
BEGIN;
SELECT rate_limit.create_policy('mon_api', 2, '1 minute');
SELECT rate_limit.create_policy('mon_trial', 1, '1 minute', shadow => true);
SELECT rate_limit.create_policy('mon_jobs', 3, '10 minutes', algorithm => 'concurrency');
SELECT lease IS NOT NULL AS leased FROM rate_limit.acquire('mon_jobs', 'worker1');
SELECT lease IS NOT NULL AS leased FROM rate_limit.acquire('mon_jobs', 'worker2');
-- a backend that dropped a call of key b1 and two of b2 (the second acquired after the first cut): the
-- limits fall from 4 leases to 3.6, and for b2 to 3.24
SELECT rate_limit.create_policy('mon_backend', 4, '10 minutes', algorithm => 'concurrency',
    options => '{"latency_target": "1 second"}');
SELECT rate_limit.release('mon_backend', 'b1', lease, 'dropped') FROM rate_limit.acquire('mon_backend', 'b1');
SELECT rate_limit.release('mon_backend', 'b2', lease, 'dropped') FROM rate_limit.acquire('mon_backend', 'b2');
SELECT rate_limit.release('mon_backend', 'b2', lease, 'dropped') FROM rate_limit.acquire('mon_backend', 'b2');

CREATE ROLE mon_agent IN ROLE pg_monitor;
SET ROLE mon_agent;
SELECT policy, algorithm, rate, period_seconds, burst, shadow, leases_held
FROM rate_limit.metrics_policies WHERE policy LIKE 'mon\_%' ORDER BY policy;
-- two keys cut, the lowest to 3.24 leases, the two at 3.42 on average (NULL for the other policies)
SELECT policy, adaptive_limited_keys, adaptive_lowest_limit, adaptive_mean_limit
FROM rate_limit.metrics_policies WHERE policy LIKE 'mon\_%' ORDER BY policy;
-- and nothing of the buckets themselves
SAVEPOINT s;
SELECT count(*) FROM rate_limit.buckets;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
RESET ROLE;
ROLLBACK;
