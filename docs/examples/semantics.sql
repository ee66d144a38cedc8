-- The examples of docs/semantics.md, run in order on a fresh database with the extension (as its owner,
-- library preloaded, default settings); scripts/doc-examples.py --write regenerates the blocks.
--@ block semantics-shadow
--@ hide
SELECT rate_limit.create_policy('per_user', 100, '1 minute');
--@ hide
SELECT rate_limit.create_policy('per_user_strict', 3, '1 minute', shadow => true);
SELECT allowed, remaining, shadow_denied, policy
FROM rate_limit.take_many(ARRAY['per_user', 'per_user_strict'], ARRAY['u1'], 2);
SELECT allowed, remaining, shadow_denied, policy
FROM rate_limit.take_many(ARRAY['per_user', 'per_user_strict'], ARRAY['u1'], 2);
SELECT policy, floor(tokens) AS tokens FROM rate_limit.buckets ORDER BY policy;

--@ block semantics-charges
--@ hide
SELECT rate_limit.create_policy('bytes_out', 100, '1 minute', burst => 10000, max_debt => 20000);
SELECT allowed, remaining FROM rate_limit.charge('bytes_out', 'client_9', 25000);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'bytes_out';
SELECT allowed, ceil(extract(epoch FROM retry_after) / 60) AS retry_minutes FROM rate_limit.take('bytes_out', 'client_9');
SELECT allowed, remaining FROM rate_limit.charge('bytes_out', 'client_9', 50000);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'bytes_out';

--@ block semantics-calendar
--@ hide
SELECT rate_limit.create_policy('daily_tokyo', 2, '1 day', algorithm => 'calendar_window',
                                time_zone => 'Asia/Tokyo');
SELECT allowed, remaining FROM rate_limit.take('daily_tokyo', 'k', 2);
-- denied until midnight in Tokyo
SELECT allowed,
       clock_timestamp() + retry_after
         - (date_trunc('day', clock_timestamp() AT TIME ZONE 'Asia/Tokyo') + interval '1 day') AT TIME ZONE 'Asia/Tokyo'
         < interval '1 second' AS until_midnight_in_tokyo
FROM rate_limit.take('daily_tokyo', 'k');

--@ block semantics-leases
--@ hide
SELECT rate_limit.create_policy('renders', 1, '1 hour', algorithm => 'concurrency', store => 'table');
-- a lease taken in a transaction that rolls back is released with it
BEGIN;
SELECT allowed, remaining FROM rate_limit.acquire('renders', 'user_5');
ROLLBACK;
SELECT allowed, remaining FROM rate_limit.acquire('renders', 'user_5');
SELECT allowed, remaining FROM rate_limit.acquire('renders', 'user_5');

--@ block semantics-blocks
--@ hide
SELECT rate_limit.create_policy('signup', 2, '1 hour', block_after => 2, block_for => '1 day', store => 'table');
--@ hide
SELECT count(rate_limit.take('signup', '203.0.113.9')) FROM generate_series(1, 2);
-- in the table store, a denial counted in a transaction that rolls back is forgotten
BEGIN;
SELECT allowed, ceil(extract(epoch FROM retry_after) / 60) AS retry_minutes FROM rate_limit.take('signup', '203.0.113.9');
ROLLBACK;
SELECT allowed, ceil(extract(epoch FROM retry_after) / 60) AS retry_minutes FROM rate_limit.take('signup', '203.0.113.9');
-- the second denial within the hour blocks the address for a day, and says so
SELECT allowed, ceil(extract(epoch FROM retry_after) / 3600) AS retry_hours FROM rate_limit.take('signup', '203.0.113.9');
SELECT algorithm, floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'signup' ORDER BY algorithm;
