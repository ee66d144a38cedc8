-- Statistics: what each policy granted and denied, and which keys it denied most. They live in shared
-- memory (not rolled back with the transaction); only the extension's owner may read or reset them.
BEGIN;
SELECT rate_limit.create_policy('stats_demo', 2, '1 day');
SELECT allowed FROM rate_limit.take('stats_demo', 'alice')
UNION ALL SELECT allowed FROM rate_limit.take('stats_demo', 'alice')
UNION ALL SELECT allowed FROM rate_limit.take('stats_demo', 'alice')
UNION ALL SELECT allowed FROM rate_limit.take('stats_demo', 'alice')
UNION ALL SELECT allowed FROM rate_limit.take('stats_demo', 'bob', 3);

-- calls, grants, denials and tokens granted since "since"; peeks (cost 0) are not counted
SELECT remaining FROM rate_limit.peek('stats_demo', 'bob');
SELECT kind, policy, calls, granted, denied, tokens_granted,
       last_denial >= since AS denied_since, since <= clock_timestamp() AS since_in_the_past
FROM rate_limit.stats WHERE policy = 'stats_demo';

-- the keys denied most: each was denied between denials_min and denials times
SELECT rank, key, denials, denials_min FROM rate_limit.top_limited WHERE policy = 'stats_demo' ORDER BY rank;

-- a penalty box's denials, the blocked ones too, are counted like any other
SELECT rate_limit.create_policy('stats_login', 3, '1 minute', block_after => 2, block_for => '1 hour');
SELECT count(*) FILTER (WHERE allowed) AS granted
FROM generate_series(1, 6) AS g, LATERAL rate_limit.take('stats_login', 'mallory' || left(g::text, 0));
SELECT calls, granted, denied FROM rate_limit.stats WHERE policy = 'stats_login';

-- another role cannot read them
CREATE ROLE stats_reader;
SET ROLE stats_reader;
SAVEPOINT denied;
SELECT count(*) FROM rate_limit.stats;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO denied;
SELECT rate_limit.reset_stats('stats_demo');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO denied;
RESET ROLE;

-- the owner resets a policy's statistics (or, without an argument, all of this database's)
SELECT rate_limit.reset_stats('stats_demo') AS reset;
SELECT calls, granted, denied, tokens_granted, last_denial FROM rate_limit.stats WHERE policy = 'stats_demo';
SELECT count(*) AS top_keys FROM rate_limit.top_limited WHERE policy = 'stats_demo';
ROLLBACK;
