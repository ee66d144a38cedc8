-- Decisions in bulk: rate_limit.take_batch(policy, keys, costs, all_or_nothing) decides many keys of one
-- policy in one statement, each as take(policy, key, cost) would, and returns one row per key in the
-- order given. For queue consumers and batch jobs.
BEGIN;
SET LOCAL rate_limit.store = 'table';
SELECT rate_limit.create_policy('jobs_per_tenant', 5, '1 minute', burst => 3);

-- a page of jobs: one row per job, in order; a tenant named twice is taken twice
SELECT ordinality, key, allowed, remaining
FROM rate_limit.take_batch('jobs_per_tenant', ARRAY['acme', 'globex', 'acme', 'acme', 'acme']);

-- joined back to the work it limits, by position
CREATE TEMP TABLE queue (id int, tenant text) ON COMMIT DROP;
INSERT INTO queue VALUES (1, 'initech'), (2, 'globex'), (3, 'initech');
WITH page AS (SELECT array_agg(tenant ORDER BY id) AS tenants, array_agg(id ORDER BY id) AS ids FROM queue)
SELECT page.ids[d.ordinality] AS id, d.key AS tenant, d.allowed
FROM page, rate_limit.take_batch('jobs_per_tenant', page.tenants) d
ORDER BY d.ordinality;

-- a cost per key (0 only reports)
SELECT key, allowed, remaining
FROM rate_limit.take_batch('jobs_per_tenant', ARRAY['umbrella', 'umbrella', 'umbrella'], ARRAY[2, 0, 2]);

-- all or nothing, where asked: at most 16 keys, one cost; nothing is taken unless every key has it
SELECT key, allowed, remaining
FROM rate_limit.take_batch('jobs_per_tenant', ARRAY['hooli', 'globex'], ARRAY[2, 2], all_or_nothing => true);
SELECT remaining FROM rate_limit.peek('jobs_per_tenant', 'hooli');

-- bad input: class 22 with a hint
SAVEPOINT bad;
SELECT * FROM rate_limit.take_batch('jobs_per_tenant', ARRAY['acme', NULL]);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT * FROM rate_limit.take_batch('jobs_per_tenant', ARRAY['acme'], ARRAY[1, 1]);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
ROLLBACK;
