-- The memory store (needs shared_preload_libraries = 'rate_limit'): the same calls and answers, kept in
-- shared memory instead of a table. Choose it per session, role or database with rate_limit.store.
SET rate_limit.store = 'memory';
SELECT n, rate_limiting_request('mem_seed', 1, 10) AS remaining FROM generate_series(1, 12) AS n;

-- Not transactional: a token taken stays taken, even if the transaction rolls back.
BEGIN;
SELECT rate_limiting_request('mem_tx', 1, 10) AS remaining;
ROLLBACK;
SELECT rate_limiting_request('mem_tx', 1, 10) AS remaining;

-- Works in read-only transactions (and on hot standbys), where the table store cannot record a grant.
BEGIN READ ONLY;
SELECT rate_limiting_request('mem_ro', 1, 10) AS remaining;
ROLLBACK;

-- peek, the view (which says where each bucket lives) and reset act on the memory store too
SELECT rate_limit.peek_request('mem_tx', 1, 10) AS tokens;
SELECT kind, key, tokens BETWEEN 8 AND 8.5 AS about_8, "limit", rate, store
FROM rate_limit.buckets WHERE key = 'mem_tx';
SELECT rate_limit.reset_request('mem_tx') AS existed;

-- Size of the table in shared memory (max_buckets is set at server start): 96-byte slots with 25% to
-- spare, and 16 bytes per bucket that count each database's and each role's buckets (the shares)
SELECT slot_bytes, bytes_per_bucket <= 144 AS at_most_144_bytes_per_bucket
FROM rate_limit.memory_usage();
-- a policy that keeps its buckets in the memory store works in read-only transactions too
SELECT rate_limit.create_policy('mem_policy', 5, '1 second', store => 'memory');
BEGIN READ ONLY;
SELECT allowed, remaining FROM rate_limit.take('mem_policy', 'ro');
ROLLBACK;
SELECT rate_limit.drop_policy('mem_policy');

-- Not transactional, so reset by hand: this example leaves no bucket behind
SELECT rate_limit.reset_request('mem_seed') AS seed_existed, rate_limit.reset_request('mem_ro') AS ro_existed;
RESET rate_limit.store;
