-- The bounds of the shared resources are a superuser's settings: a database fills only its share of the
-- server's memory store, and no role may raise a bound for itself. Trigger functions refuse to be called
-- as functions. (Compiled edition: the memory store and its settings need the library.)
BEGIN;
CREATE ROLE rl_bounded NOLOGIN;
SET ROLE rl_bounded;
SET rate_limit.store = 'memory';

-- the share of this database (50% of every partition by default): the most buckets it may hold
SELECT share_percent, share_buckets * 2 <= max_buckets + partitions AS at_most_half
FROM rate_limit.memory_usage();

-- a limit that refills within a day is anyone's in the memory store too
SELECT allowed FROM rate_limit.take_ad_hoc('bounds_ip', 100, '1 day');
SAVEPOINT s;

-- the bounds are the superuser's
SET rate_limit.max_wait = '1h';
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
SET rate_limit.database_share = 100;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;

-- a trigger function is not a function to call
SELECT rate_limit.limit_writes();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- the memory store is not transactional: the rollback kept the ad-hoc bucket, so it is reset by hand
SET rate_limit.store = 'memory';
SELECT rate_limit.reset_ad_hoc('bounds_ip') AS existed;
RESET rate_limit.store;
