-- Shadow mode in the compiled edition's statistics, and rate_limit.shadow, the switch that puts every limit
-- in shadow mode (both need the library).
BEGIN;
SELECT rate_limit.create_policy('watched_limit', 2, '1 day', shadow => true);
SELECT count(*) FILTER (WHERE shadow_denied) AS would_deny
FROM generate_series(1, 4) AS g, LATERAL rate_limit.take('watched_limit', 'alice' || left(g::text, 0));
-- counted: 4 calls, 2 granted, 2 (would-be) denied, and alice on top of the denied keys
SELECT calls, granted, denied FROM rate_limit.stats WHERE policy = 'watched_limit';
SELECT rank, key, denials FROM rate_limit.top_limited WHERE policy = 'watched_limit';
ROLLBACK;

-- rate_limit.shadow puts every limit in shadow mode (policies, ad-hoc limits, rate_limiting_request): the
-- switch for an incident. Only a superuser may set it, so that no role can lift its own limits.
BEGIN;
SELECT rate_limit.create_policy('strict', 1, '1 day');
SELECT allowed FROM rate_limit.take('strict', 'bob');
SELECT allowed FROM rate_limit.take('strict', 'bob');
SET LOCAL rate_limit.shadow = on;
SELECT allowed, shadow_denied FROM rate_limit.take('strict', 'bob');
SELECT rate_limiting_request('shadow_demo', 1, 1) AS first,
       rate_limiting_request('shadow_demo', 1, 1) AS second_not_refused;
SET LOCAL rate_limit.shadow = off;
CREATE ROLE shadow_seeker;
SET LOCAL ROLE shadow_seeker;
SAVEPOINT refused;
SET rate_limit.shadow = on;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO refused;
SELECT allowed FROM rate_limit.take('strict', 'bob');
ROLLBACK;
