-- Hierarchical quotas: a tenant's key has one pool of 100 requests an hour, shared by search (at most 80)
-- and exports (at most 30). A call on a child policy takes from its own bucket and from its parent's
-- bucket of the same key, all or nothing; the decision names the level that decided.
BEGIN;
SELECT rate_limit.create_policy('pool', 100, '1 hour');
SELECT rate_limit.create_policy('search', 80, '1 hour', options => '{"parent": "pool"}');
SELECT rate_limit.create_policy('export', 30, '1 hour', options => '{"parent": "pool"}');
SELECT name, parent FROM rate_limit.policies ORDER BY name;

-- search is the tighter level: it decides
SELECT allowed, remaining, policy FROM rate_limit.take('search', 'acme', 70);
-- then export and the pool both hold 5: a tie names the child
SELECT allowed, remaining, policy FROM rate_limit.take('export', 'acme', 25);
-- search has 10 left but the pool 5: denied by the pool, and search keeps its tokens
SELECT allowed, remaining, policy FROM rate_limit.take('search', 'acme', 6);
SELECT allowed, remaining, policy FROM rate_limit.peek('search', 'acme');
-- another tenant has a pool of its own
SELECT allowed, remaining, policy FROM rate_limit.take('export', 'globex', 30);

-- one level only: a child cannot be a parent
SAVEPOINT s;
SELECT rate_limit.create_policy('search_bulk', 10, '1 hour', options => '{"parent": "search"}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
-- a parent outlives its children
SAVEPOINT s;
SELECT rate_limit.drop_policy('pool');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
-- a child may leave its parent: then it takes from its own bucket alone
SELECT rate_limit.alter_policy('export', options => '{"parent": null}');
SELECT allowed, remaining, policy FROM rate_limit.take('export', 'acme', 5);
ROLLBACK;
