-- Monitoring: the views a Prometheus exporter reads (monitoring/queries.yaml), as a role that is only in
-- pg_monitor. Refusals, would-be denials of shadow mode and denials by a block are counted apart; the
-- policies' numbers are gauges; keys are shown only up to rate_limit.metrics_top_keys per policy.
BEGIN;
SELECT rate_limit.create_policy('mon_api', 2, '1 minute');
SELECT rate_limit.create_policy('mon_trial', 1, '1 minute', shadow => true);
SELECT allowed FROM rate_limit.block('mon_api', 'mallory', '1 hour');
SELECT count(*) FILTER (WHERE allowed) AS allowed, count(*) FILTER (WHERE NOT allowed) AS denied
FROM generate_series(1, 4) AS g, LATERAL rate_limit.take('mon_api', 'alice' || left(g::text, 0));
SELECT allowed FROM rate_limit.take('mon_api', 'mallory');
SELECT count(*) FILTER (WHERE allowed) AS allowed, count(*) FILTER (WHERE shadow_denied) AS would_deny
FROM generate_series(1, 3) AS g, LATERAL rate_limit.take('mon_trial', 'bob' || left(g::text, 0));

CREATE ROLE mon_agent IN ROLE pg_monitor;
SET ROLE mon_agent;
SELECT policy, calls, granted, denied, shadow_denied, blocked, tokens_granted
FROM rate_limit.metrics WHERE policy LIKE 'mon\_%' ORDER BY policy;
-- no keys until a superuser allows some per policy (each one is a label in Prometheus)
SELECT count(*) FROM rate_limit.metrics_top_keys WHERE policy LIKE 'mon\_%';
RESET ROLE;
SET rate_limit.metrics_top_keys = 1;
SET ROLE mon_agent;
SELECT policy, rank, key, denials FROM rate_limit.metrics_top_keys WHERE policy LIKE 'mon\_%' ORDER BY policy;
-- and nothing else of the owner's
SAVEPOINT s;
SELECT count(*) FROM rate_limit.stats;
ROLLBACK TO SAVEPOINT s;
SELECT rate_limit.reset_stats();
ROLLBACK TO SAVEPOINT s;
RESET ROLE;
ROLLBACK;
