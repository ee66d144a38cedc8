-- Inspecting and managing buckets: peek, the buckets view, reset and purge.
BEGIN;
SELECT rate_limiting_request('alice', 1, 100) FROM generate_series(1, 3);

-- peek: whole tokens now, nothing taken (a never-seen id is a full bucket)
SELECT rate_limit.peek_request('alice', 1, 100) AS alice, rate_limit.peek_request('nobody', 1, 100) AS nobody;
SELECT rate_limit.peek_request('alice', 1, 100) AS alice_again;

-- the buckets view: every bucket of every kind, exact tokens now (to the millionth), the numbers last
-- used, the store
SELECT kind, key, tokens BETWEEN 97 AND 97.5 AS about_97, "limit", rate, per, algorithm, store
FROM rate_limit.buckets ORDER BY key;

-- reset: the bucket is deleted, i.e. full again; true if it existed
SELECT rate_limit.reset_request('alice') AS existed, rate_limit.reset_request('alice') AS existed_again;
SELECT rate_limiting_request('alice', 1, 100) AS remaining;

-- purge: deletes the buckets that are full now; a missing bucket is a full one, so nothing is lost
SELECT rate_limiting_request('burst', 1000, 1) AS remaining;   -- full again 1 ms later
SELECT pg_sleep(0.05);
SELECT rate_limit.purge() AS purged;
SELECT key FROM rate_limit.buckets ORDER BY key;
ROLLBACK;
