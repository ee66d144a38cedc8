-- What a role with no privileges cannot do to others: the bounds of the shared resources. Its database
-- fills only its share of the server's memory store; limits it chooses must refill within
-- rate_limit.max_refill_time; wait sleeps at most rate_limit.max_wait; trigger functions refuse to be
-- called as functions. All four bounds are superuser settings.
BEGIN;
CREATE ROLE rl_bounded NOLOGIN;
SET ROLE rl_bounded;
SET rate_limit.store = 'memory';

-- the share of this database (50% of every partition by default): the most buckets it may hold
SELECT share_percent, share_buckets * 2 <= max_buckets + partitions AS at_most_half
FROM rate_limit.memory_usage();

-- a limit that refills within a day is anyone's; a slower one is the owner's (named policies)
SELECT allowed FROM rate_limit.take_ad_hoc('bounds_ip', 100, '1 day');
SAVEPOINT s;
SELECT allowed FROM rate_limit.take_ad_hoc('bounds_ip', 1, '36500000 days');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
SELECT rate_limiting_request('bounds_id', 1, 2147483647);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;

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
