-- Inspecting and managing buckets: peek, the buckets view, reset and purge.
BEGIN;
SELECT rate_limiting_request('alice', 1, 100) FROM generate_series(1, 3);

-- peek: whole tokens now, nothing taken (a never-seen id is a full bucket)
SELECT rate_limit.peek('alice', 1, 100) AS alice, rate_limit.peek('nobody', 1, 100) AS nobody;
SELECT rate_limit.peek('alice', 1, 100) AS alice_again;

-- the buckets view: exact tokens now (to the millionth), the limit last used, the store
SELECT id, tokens BETWEEN 97 AND 97.5 AS about_97, capacity, refill_per_sec, store
FROM rate_limit.buckets ORDER BY id;

-- reset: the bucket is deleted, i.e. full again; true if it existed
SELECT rate_limit.reset('alice') AS existed, rate_limit.reset('alice') AS existed_again;
SELECT rate_limiting_request('alice', 1, 100) AS remaining;

-- purge: deletes the buckets that are full now; a missing bucket is a full one, so nothing is lost
SELECT rate_limiting_request('burst', 1000, 1) AS remaining;   -- full again 1 ms later
SELECT pg_sleep(0.05);
SELECT rate_limit.purge() AS purged;
SELECT id FROM rate_limit.buckets ORDER BY id;
ROLLBACK;
