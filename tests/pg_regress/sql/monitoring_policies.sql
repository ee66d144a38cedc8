-- Monitoring, the policies' numbers: rate_limit.metrics_policies, read by a role that is only in
-- pg_monitor (the role a Prometheus exporter runs as): each policy's rate, period and burst as gauges, and
-- for a concurrency policy the leases held now (counted by their rows, never per call).
BEGIN;
SELECT rate_limit.create_policy('mon_api', 2, '1 minute');
SELECT rate_limit.create_policy('mon_trial', 1, '1 minute', shadow => true);
SELECT rate_limit.create_policy('mon_jobs', 3, '10 minutes', algorithm => 'concurrency');
SELECT lease IS NOT NULL AS leased FROM rate_limit.acquire('mon_jobs', 'worker1');
SELECT lease IS NOT NULL AS leased FROM rate_limit.acquire('mon_jobs', 'worker2');

CREATE ROLE mon_agent IN ROLE pg_monitor;
SET ROLE mon_agent;
SELECT policy, algorithm, rate, period_seconds, burst, shadow, leases_held
FROM rate_limit.metrics_policies WHERE policy LIKE 'mon\_%' ORDER BY policy;
-- and nothing of the buckets themselves
SAVEPOINT s;
SELECT count(*) FROM rate_limit.buckets;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
RESET ROLE;
ROLLBACK;
