-- Concurrency leases: at most N requests in flight per key, not N per second. acquire(policy, key) takes a
-- lease, with its id in the decision's lease column; release(policy, key, lease) gives it back; a lease
-- nobody releases (a crashed client) expires `per` after it was acquired. In the table store a lease taken
-- in a transaction that rolls back is released with it.
BEGIN;
-- at most 2 exports per tenant at once, each lease good for 10 minutes
SELECT rate_limit.create_policy('exports', 2, '10 minutes', algorithm => 'concurrency');
CREATE TEMP TABLE held (lease bigint);

INSERT INTO held SELECT lease FROM rate_limit.acquire('exports', 'tenant_1') WHERE allowed;
SELECT allowed, remaining, "limit", lease IS NOT NULL AS has_lease FROM rate_limit.acquire('exports', 'tenant_1');
-- both leases are held: denied until the first one expires (or is released)
SELECT allowed, remaining, lease, retry_after <= interval '10 minutes' AS retry_within_the_ttl
FROM rate_limit.acquire('exports', 'tenant_1');
-- another tenant has leases of its own
SELECT allowed, remaining FROM rate_limit.acquire('exports', 'tenant_2');
-- give one back: a lease is released once
SELECT rate_limit.release('exports', 'tenant_1', lease) FROM held;
SELECT rate_limit.release('exports', 'tenant_1', lease) FROM held;
SELECT allowed, remaining FROM rate_limit.acquire('exports', 'tenant_1');
-- an id that is not a lease of this key releases nothing
SELECT rate_limit.release('exports', 'tenant_1', 42);

-- a lease taken in a rolled-back (sub)transaction is released with it
SELECT allowed, remaining FROM rate_limit.acquire('exports', 'tenant_3');
SAVEPOINT work;
SELECT allowed, remaining FROM rate_limit.acquire('exports', 'tenant_3');
ROLLBACK TO work;
SELECT allowed, remaining FROM rate_limit.acquire('exports', 'tenant_3');

-- the HTTP fields: the draft's concurrent-requests quota unit
SELECT rate_limit.headers(d) FROM rate_limit.acquire('exports', 'tenant_4') AS d;
-- each key lists one bucket per lease slot it used: 0 tokens while it holds a lease
SELECT policy, key, tokens, "limit", algorithm FROM rate_limit.buckets
WHERE policy = 'exports' AND key = 'tenant_4' ORDER BY tokens;

-- a role with only LOGIN may acquire and release (a release needs the lease's id), not manage policies
CREATE ROLE leaser;
SET LOCAL ROLE leaser;
CREATE TEMP TABLE mine AS SELECT lease FROM rate_limit.acquire('exports', 'tenant_5');
SELECT rate_limit.release('exports', 'tenant_5', lease) FROM mine;
SAVEPOINT not_owner;
SELECT rate_limit.create_policy('mine', 1, '1 minute', algorithm => 'concurrency');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO not_owner;
RESET ROLE;

-- the wrong kind of policy, either way: 42809
SELECT rate_limit.create_policy('tokens', 10, '1 minute');
SAVEPOINT bad;
SELECT * FROM rate_limit.take('exports', 'tenant_1');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT * FROM rate_limit.acquire('tokens', 'tenant_1');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
-- bad input: class 22 with a hint
SELECT rate_limit.release('exports', 'tenant_1', NULL);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('huge', 1001, '1 minute', algorithm => 'concurrency');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('burst', 2, '1 minute', burst => 3, algorithm => 'concurrency');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('monthly', 2, '1 month', algorithm => 'concurrency');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
ROLLBACK;
