-- The seed example (the reference contract's own): refill 1 token per second, window 10 seconds.
\echo 'Twelve calls in quick succession for id user1 (capacity 1 x 10 = 10 tokens):'
SELECT n AS call, rate_limiting_request('user1', 1, 10) AS remaining FROM generate_series(1, 12) AS n;
\echo 'Idle for 4 seconds...'
SELECT pg_sleep(4) \g /dev/null
\echo 'One more call: 4 tokens were refilled, one is taken, 3 remain:'
SELECT rate_limiting_request('user1', 1, 10) AS remaining;
\echo 'The bucket, refilled to this moment (exact to the millionth of a token):'
SELECT kind, key, tokens, "limit", rate, per, updated_at FROM rate_limit.buckets WHERE key = 'user1';
