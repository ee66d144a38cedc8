-- Adaptive concurrency: a concurrency policy with a latency_target adapts each key's limit to how its
-- calls go, between adaptive_min and its rate, shared by every connection: a good call adds 1/limit of a
-- lease (one lease per round of good calls); a call slower than the target, dropped or timed out cuts
-- the limit to 9/10, once per round (a call acquired before the last cut does not cut it again).
-- release(policy, key, lease, outcome, latency) reports how the call went: outcome 'ok' (the default),
-- 'dropped' or 'timeout'; latency NULL (the default) means how long the lease was held.
BEGIN;
-- up to 10 calls at once to the payments backend per merchant, fewer while it is slow: at least 2
SELECT rate_limit.create_policy('payments', 10, '1 minute', algorithm => 'concurrency',
    options => '{"latency_target": "250 milliseconds", "adaptive_min": 2}');
SELECT name, rate, adaptive_min, latency_target FROM rate_limit.policies WHERE name = 'payments';

-- a new key is at its most: 10 leases, then a denial
CREATE TEMP TABLE held AS
SELECT (rate_limit.acquire('payments', 'acme')).lease FROM generate_series(1, 10);
SELECT count(lease) AS granted FROM held;
SELECT allowed, remaining FROM rate_limit.acquire('payments', 'acme');

-- reports, in slot order: a fast call changes nothing (the limit is at its most); a slow one cuts it to
-- 9; a dropped one acquired before that cut does not cut it again; each fast one adds 1/limit
CREATE TEMP TABLE reports AS
SELECT lease, pg_catalog.row_number() OVER (ORDER BY lease & 1023) AS n FROM held;
SELECT n, rate_limit.release('payments', 'acme', lease,
           outcome => CASE n WHEN 3 THEN 'dropped' ELSE 'ok' END,
           latency => CASE n WHEN 1 THEN interval '100 ms' WHEN 2 THEN interval '900 ms' END) AS released
FROM reports ORDER BY n;
-- the key's limit, in leases: 9.747 (the 7 good calls add 111, 109, 108, 107, 105, 104 and 103
-- thousandths: 1/limit each, rounded down)
SELECT key, tokens AS leases, algorithm FROM rate_limit.buckets
WHERE policy = 'payments' AND algorithm = 'adaptive_limit';
-- every lease is free, and the limit allows 9: this acquire leaves 8
CREATE TEMP TABLE again AS SELECT lease, remaining FROM rate_limit.acquire('payments', 'acme');
SELECT remaining FROM again;
-- a call acquired after the cut that times out cuts again: 9.747 × 9/10, in whole thousandths
SELECT rate_limit.release('payments', 'acme', lease, outcome => 'timeout') FROM again;
SELECT tokens AS leases FROM rate_limit.buckets WHERE policy = 'payments' AND algorithm = 'adaptive_limit';

-- a policy with fixed leases takes the same reports and ignores them
SELECT rate_limit.create_policy('exports', 2, '10 minutes', algorithm => 'concurrency');
SELECT rate_limit.release('exports', 'acme', lease, outcome => 'dropped')
FROM rate_limit.acquire('exports', 'acme');
SELECT count(*) AS limits FROM rate_limit.buckets WHERE policy = 'exports' AND algorithm = 'adaptive_limit';
-- alter_policy makes a policy adaptive, or fixed again (null clears an option)
SELECT rate_limit.alter_policy('exports', options => '{"latency_target": "2 seconds"}');
SELECT adaptive_min, latency_target FROM rate_limit.policies WHERE name = 'exports';
SELECT rate_limit.alter_policy('exports', options => '{"latency_target": null}');
SELECT adaptive_min, latency_target FROM rate_limit.policies WHERE name = 'exports';

-- bad input: class 22 with a hint
SAVEPOINT bad;
SELECT rate_limit.release('payments', 'acme', 1, outcome => 'late');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.release('payments', 'acme', 1, outcome => NULL);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.release('payments', 'acme', 1, latency => interval '-1 second');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('tokens', 10, '1 minute', options => '{"latency_target": "1 second"}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('calls', 10, '1 minute', algorithm => 'concurrency',
    options => '{"adaptive_min": 2}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('calls', 10, '1 minute', algorithm => 'concurrency',
    options => '{"latency_target": "1 second", "adaptive_min": 11}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('calls', 10, '1 minute', algorithm => 'concurrency',
    options => '{"latency_target": "1 month"}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('calls', 10, '1 minute', algorithm => 'concurrency',
    options => '{"latency_target": 250}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
ROLLBACK;
