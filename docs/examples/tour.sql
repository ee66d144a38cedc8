-- The five-minute tour of README.md, run on a fresh database with the extension (as its owner, library
-- preloaded, default settings). Every block of README.md marked `<!-- example: tour-... -->` is this file's
-- output: scripts/doc-examples.py --write regenerates them, and the tests fail when they differ.
--@ block tour-seed
SELECT array_agg(rate_limiting_request('seed', 1, 10)) FROM generate_series(1, 12);
--@ hide
SELECT pg_sleep(4);
SELECT rate_limiting_request('seed', 1, 10);
--@ block tour-decisions
--@ hide
SELECT rate_limit.create_policy('api', rate => 10, per => '1 minute', burst => 5);

SELECT allowed, remaining, "limit", retry_after, reset_after FROM rate_limit.take('api', 'alice');

-- cost 5: denied, nothing taken
SELECT allowed, remaining, ceil(extract(epoch FROM retry_after)) AS retry_s
FROM rate_limit.take('api', 'alice', 5);

SELECT rate_limit.headers(d) FROM rate_limit.take('api', 'alice') AS d;
--@ block tour-many
--@ hide
SELECT rate_limit.create_policy('per_org', rate => 1000, per => '1 hour');
SELECT allowed, policy FROM rate_limit.take_many(ARRAY['api', 'per_org'], ARRAY['alice', 'acme']);
--@ block tour-batch
SELECT key, allowed, remaining FROM rate_limit.take_batch('per_org', ARRAY['acme', 'globex', 'acme']);

--@ block tour-monthly
--@ hide
SELECT rate_limit.create_policy('monthly', rate => 10000, per => '1 month',
                                algorithm => 'calendar_window', time_zone => 'Europe/Paris');
SELECT allowed, remaining FROM rate_limit.take('monthly', 'acme');
--@ block tour-leases
--@ hide
SELECT rate_limit.create_policy('exports', rate => 2, per => '10 minutes', algorithm => 'concurrency');
SELECT allowed, remaining, lease IS NOT NULL AS got_lease FROM rate_limit.acquire('exports', 'acme');
--@ block tour-ad-hoc
--@ hide
SELECT allowed FROM rate_limit.take_ad_hoc('ip:203.0.113.7', rate => 100, per => '1 minute');
SET rate_limit.store = 'memory';
SELECT rate_limiting_request('user1', 2, 60);
--@ block tour-buckets
SELECT kind, policy, key, floor(tokens) AS tokens, "limit", store
FROM rate_limit.buckets ORDER BY store, kind, key, policy;

-- deletes the buckets that are full now: a missing bucket is a full one
SELECT rate_limit.purge();
