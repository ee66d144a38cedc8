-- The reference example: refill 1 token per second, window 10 seconds, so a capacity of 10 tokens.
-- Calls in quick succession take one token each and return what is left; -1 means denied.
BEGIN;
SELECT n, rate_limiting_request('seed', 1, 10) AS remaining
FROM generate_series(1, 12) AS n;

-- After 4 seconds idle, 4 tokens have been refilled: the call takes one and 3 remain.
SELECT pg_sleep(4);
SELECT rate_limiting_request('seed', 1, 10) AS remaining;

-- Partial refill is never lost: 0.1 s later the bucket holds 3.1 tokens, not 3 rounded down forever.
SELECT tokens BETWEEN 3.0 AND 3.5 AS about_three_tokens FROM rate_limit.buckets WHERE key = 'seed';
ROLLBACK;

-- Defaults: 2 tokens per second, a 60-second window, so a first call leaves 119.
BEGIN;
SELECT rate_limiting_request('defaults') AS remaining;
ROLLBACK;
