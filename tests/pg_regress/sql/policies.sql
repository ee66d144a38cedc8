-- Named policies and the decision record. Call the functions in FROM (SELECT * FROM rate_limit.take(...)):
-- written as SELECT (rate_limit.take(...)).*, PostgreSQL would call the function once per column.
-- (All in one transaction, rolled back at the end: later examples find none of these policies.)
BEGIN;

-- A policy is rate tokens per period, at most burst at once (burst defaults to rate).
SELECT rate_limit.create_policy('api', rate => 10, per => '1 minute', burst => 5);
-- A window longer than rate_limit.max_policy_refill_time (400 days) needs a superuser's consent: any role
-- could leave its buckets short that long.
SET rate_limit.max_policy_refill_time = '36500d';
SELECT rate_limit.create_policy('per_century', 3, '36500 days', algorithm => 'fixed_window');
RESET rate_limit.max_policy_refill_time;
SELECT rate_limit.create_policy('recent', 4, '10 seconds', algorithm => 'sliding_window');
SELECT name, algorithm, rate, per, burst, store FROM rate_limit.policies ORDER BY name;

-- take(policy, key, cost): a full bucket of 5; one token every 6 seconds (10 per minute).
-- retry_after and reset_after are exact to the microsecond; they are printed here in whole seconds
-- (rounded up, as an HTTP Retry-After would be) because a few microseconds pass between statements.
SELECT allowed, remaining, "limit", retry_after, ceil(extract(epoch FROM reset_after)) AS reset_s, policy
FROM rate_limit.take('api', 'alice');
SELECT allowed, remaining, ceil(extract(epoch FROM reset_after)) AS reset_s
FROM rate_limit.take('api', 'alice', 4);
-- denied: nothing is taken; retry_after is when 1 token will exist
SELECT allowed, remaining, ceil(extract(epoch FROM retry_after)) AS retry_s FROM rate_limit.take('api', 'alice');
-- a cost above the burst can never be granted: retry_after is NULL and allowed is false
SELECT allowed, remaining, retry_after FROM rate_limit.take('api', 'bob', 6);
-- cost 0, or peek, reports without taking
SELECT allowed, remaining FROM rate_limit.take('api', 'bob', 0);
SELECT allowed, remaining, reset_after FROM rate_limit.peek('api', 'bob');

-- fixed_window: rate tokens per aligned window, all restored at each boundary. (Windows are aligned on
-- multiples of the period since 2000-01-01: this 36,500-day window has no boundary before December 2099,
-- so the calls below never straddle one, whenever they run. An hourly window counts alike, within each
-- hour.)
SELECT allowed, remaining, reset_after <= interval '36500 days' AS resets_within_the_window
FROM rate_limit.take('per_century', 'carol');
SELECT allowed, remaining FROM rate_limit.take('per_century', 'carol');
SELECT allowed, remaining FROM rate_limit.take('per_century', 'carol');
SELECT allowed, remaining, retry_after = reset_after AS retry_at_the_next_window
FROM rate_limit.take('per_century', 'carol');

-- sliding_window: the previous window's count, weighted by its overlap, plus the current count
SELECT allowed, remaining FROM rate_limit.take('recent', 'dave', 3);
SELECT allowed, remaining FROM rate_limit.take('recent', 'dave');
SELECT allowed, remaining, retry_after > interval '0' AS must_wait FROM rate_limit.take('recent', 'dave');

-- An ad-hoc limit without a policy: take_ad_hoc(key, rate, per, burst, cost); its decision names no policy
SELECT allowed, remaining, "limit", policy FROM rate_limit.take_ad_hoc('erin', 100, '1 hour', 20, 5);

-- Several limits at once, all or nothing: every policy grants, or nothing is taken anywhere.
-- take_many(policies, keys, cost): keys holds one key for every policy, or one key per policy.
-- The decision names the policy that denied (the one with the longest wait).
SELECT allowed, remaining, policy FROM rate_limit.take_many(ARRAY['api', 'per_century'], ARRAY['frank'], 3);
SELECT allowed, remaining, policy FROM rate_limit.take_many(ARRAY['api', 'per_century'], ARRAY['frank'], 1);
SELECT policy, key, floor(tokens) AS tokens FROM rate_limit.buckets WHERE key = 'frank' ORDER BY policy;
-- per user and per organisation in one call: keys[i] goes with policies[i]
SELECT allowed, remaining, policy
FROM rate_limit.take_many(ARRAY['api', 'per_century'], ARRAY['grace', 'org-1'], 1);

-- HTTP response fields (IETF RateLimit draft): RateLimit, RateLimit-Policy and, when denied, Retry-After
SELECT rate_limit.headers(d) FROM rate_limit.take('api', 'heidi') AS d;
SELECT rate_limit.headers(d) FROM rate_limit.take('api', 'alice') AS d;

-- refund puts tokens back (never above the burst); reset deletes the bucket (full again). Owner only.
SELECT allowed, remaining FROM rate_limit.refund('api', 'alice', 2);
SELECT allowed, remaining FROM rate_limit.refund('api', 'alice', 100);
SELECT rate_limit.reset('per_century', 'carol') AS existed;
SELECT remaining FROM rate_limit.peek('per_century', 'carol');

-- Changing a policy: buckets in use keep their tokens (rounded down, capped at the new burst) and refill
-- at the new rate from the change on; full buckets stay full.
SELECT remaining FROM rate_limit.take('api', 'ivan', 4);
SELECT rate_limit.alter_policy('api', burst => 3);
SELECT remaining, "limit" FROM rate_limit.peek('api', 'ivan');
SELECT remaining, "limit" FROM rate_limit.peek('api', 'nobody');
SELECT rate_limit.alter_policy('api', burst => 5);

-- wait sleeps (on the backend's latch) until the tokens exist, then takes them; with a timeout too short
-- for the next token it gives up at once and takes nothing
SELECT allowed, remaining FROM rate_limit.wait('api', 'alice', 5, timeout => '1 second');
SELECT allowed, ceil(extract(epoch FROM retry_after)) AS retry_s
FROM rate_limit.wait('api', 'alice', 1, timeout => '1 second');
SELECT rate_limit.create_policy('tenth', 10, '1 second', burst => 1);
SELECT allowed FROM rate_limit.take('tenth', 'judy');
SELECT clock_timestamp() AS before \gset
SELECT allowed FROM rate_limit.wait('tenth', 'judy', 1, timeout => '1 second');
SELECT clock_timestamp() - :'before' BETWEEN interval '50 ms' AND interval '600 ms' AS slept_about_100_ms;

-- Transactions: with the table store a rollback refunds what the transaction took (here to a savepoint)
SAVEPOINT before_kim;
SELECT remaining FROM rate_limit.take('api', 'kim', 5);
ROLLBACK TO SAVEPOINT before_kim;
SELECT remaining FROM rate_limit.peek('api', 'kim');

-- Dropping a policy deletes its buckets
SELECT rate_limit.drop_policy('recent') AS dropped;
SELECT count(*) FROM rate_limit.buckets WHERE policy = 'recent';

-- 'gcra', the generic cell rate algorithm, is another name of the token bucket (which decides exactly as
-- GCRA does): the policy reads back as token_bucket
SELECT rate_limit.create_policy('cells', 10, '1 second', algorithm => 'gcra');
SELECT algorithm, rate, burst FROM rate_limit.policies WHERE name = 'cells';
ROLLBACK;
