-- The examples of docs/reference.md, run in order on a fresh database with the extension (as its owner,
-- library preloaded, default settings). Every block of docs/reference.md marked `<!-- example: reference-... -->`
-- is this file's output: scripts/doc-examples.py --write regenerates them, and the tests fail when they differ.
-- Time-dependent figures are shown rounded, as a client would print them.
--@ block reference-rate-limiting-request
SELECT rate_limiting_request('user1', 2, 60);
SELECT rate_limiting_request('user1');

--@ block reference-peek-request
SELECT rate_limit.peek_request('user1', 2, 60);
SELECT rate_limit.tokens('user1', 2, 60) BETWEEN 118 AND 119 AS about_118;

--@ block reference-create-policy
--@ hide
SELECT rate_limit.create_policy('api', rate => 10, per => '1 minute', burst => 5);
--@ hide
SELECT rate_limit.create_policy('hourly', 1000, '1 hour', algorithm => 'fixed_window');
--@ hide
SELECT rate_limit.create_policy('per_org', 1000, '1 hour', store => 'table');
SELECT name, algorithm, rate, per, burst, store FROM rate_limit.policies ORDER BY name;

--@ block reference-policy-options
--@ hide
SELECT rate_limit.create_policy('partner', 600, '1 minute',
                                options => '{"description": "Partner API, owned by the integrations team"}');
-- options left out keep their values
--@ hide
SELECT rate_limit.alter_policy('partner', rate => 1200);
SELECT name, rate, description FROM rate_limit.policies WHERE name = 'partner';
--@ hide
SELECT rate_limit.alter_policy('partner', options => '{"description": null}');
SELECT description IS NULL AS cleared FROM rate_limit.policies WHERE name = 'partner';

--@ block reference-take
SELECT allowed, remaining, "limit", retry_after, reset_after, policy FROM rate_limit.take('api', 'alice');
SELECT allowed, remaining, ceil(extract(epoch FROM retry_after)) AS retry_s FROM rate_limit.take('api', 'alice', 5);
SELECT allowed, remaining, retry_after FROM rate_limit.take('api', 'bob', 6);

--@ block reference-allow
SELECT rate_limit.allow('api', 'ivy', 4) AS first, rate_limit.allow('api', 'ivy') AS second,
       rate_limit.allow('api', 'ivy') AS third;

--@ block reference-take-many
SELECT allowed, remaining, policy FROM rate_limit.take_many(ARRAY['api', 'per_org'], ARRAY['carol', 'acme']);
SELECT allowed, remaining, policy FROM rate_limit.take_many(ARRAY['api', 'per_org'], ARRAY['carol'], 5);

--@ block reference-take-batch
SELECT ordinality, key, allowed, remaining FROM rate_limit.take_batch('api', ARRAY['fay', 'gus', 'fay'], ARRAY[2, 1, 4]);
SELECT key, allowed, remaining FROM rate_limit.take_batch('api', ARRAY['gus', 'hal'], ARRAY[5, 5], all_or_nothing => true);

--@ block reference-take-ad-hoc
SELECT allowed, remaining, "limit", policy FROM rate_limit.take_ad_hoc('ip:203.0.113.7', 100, '1 minute');

--@ block reference-peek
SELECT allowed, remaining, "limit" FROM rate_limit.peek('api', 'alice');

--@ block reference-wait
SELECT allowed, remaining FROM rate_limit.wait('api', 'dave', 1, timeout => '2 seconds');

--@ block reference-refund
SELECT allowed, remaining FROM rate_limit.refund('api', 'alice', 1);

--@ block reference-headers
SELECT rate_limit.headers(d) FROM rate_limit.take('api', 'erin') AS d;
SELECT rate_limit.headers(d) FROM rate_limit.take('api', 'erin', 5) AS d;

--@ block reference-reset
SELECT rate_limit.reset('api', 'alice'), rate_limit.reset_ad_hoc('ip:203.0.113.7'), rate_limit.reset_request('user1');

--@ block reference-alter-policy
--@ hide
SELECT rate_limit.alter_policy('api', burst => 3);
SELECT remaining, "limit" FROM rate_limit.peek('api', 'erin');
SELECT rate_limit.drop_policy('hourly');

--@ block reference-buckets
SELECT kind, policy, key, floor(tokens) AS tokens, "limit", rate, per, algorithm, store
FROM rate_limit.buckets ORDER BY kind, policy, key;
SELECT rate_limit.purge();

--@ block reference-clock-shift
SELECT rate_limit.clock_shift();

--@ block reference-memory-usage
SELECT max_buckets, slot_bytes, bytes_per_bucket FROM rate_limit.memory_usage();

--@ block reference-stats
SELECT kind, policy, calls, granted, denied, tokens_granted FROM rate_limit.stats ORDER BY kind, policy;
SELECT kind, policy, rank, key, denials, denials_min FROM rate_limit.top_limited ORDER BY kind, policy, rank;

--@ block reference-limit-writes
--@ hide
SELECT rate_limit.create_policy('comments_per_author', 2, '1 day');
CREATE TABLE comments (id int GENERATED ALWAYS AS IDENTITY, author_id int NOT NULL, body text NOT NULL);
CREATE TRIGGER comments_rate_limit BEFORE INSERT ON comments
    FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('comments_per_author', 'author_id');
INSERT INTO comments (author_id, body) VALUES (1, 'first'), (1, 'second');
INSERT INTO comments (author_id, body) VALUES (1, 'third');

--@ block reference-errors
SELECT rate_limiting_request(NULL);
SELECT * FROM rate_limit.take('nope', 'k');
SELECT * FROM rate_limit.take('api', 'k', -1);

--@ block reference-calendar
--@ hide
SELECT rate_limit.create_policy('monthly', 3, '1 month', algorithm => 'calendar_window',
                                time_zone => 'Europe/Paris', anchor => '2026-01-15 00:00');
SELECT name, algorithm, per, time_zone, anchor FROM rate_limit.policies WHERE name = 'monthly';
SELECT allowed, remaining FROM rate_limit.take('monthly', 'tenant_9', 3);
-- denied until the next 15th at 00:00 in Paris
SELECT allowed,
       clock_timestamp() + retry_after - (
         SELECT min(d) FROM generate_series(timestamp '2026-01-15', '2100-01-15', interval '1 month') AS d
         WHERE (d AT TIME ZONE 'Europe/Paris') > clock_timestamp()) AT TIME ZONE 'Europe/Paris'
         < interval '1 second' AS until_the_next_15th
FROM rate_limit.take('monthly', 'tenant_9');

--@ block reference-leases
--@ hide
SELECT rate_limit.create_policy('exports', 2, '10 minutes', algorithm => 'concurrency');
--@ hide
CREATE TEMP TABLE my_lease AS SELECT lease FROM rate_limit.acquire('exports', 'tenant_1');
SELECT allowed, remaining, lease IS NOT NULL AS got_one FROM rate_limit.acquire('exports', 'tenant_1');
SELECT allowed, remaining, lease, ceil(extract(epoch FROM retry_after) / 60) AS retry_minutes
FROM rate_limit.acquire('exports', 'tenant_1');
SELECT rate_limit.release('exports', 'tenant_1', lease) FROM my_lease;
SELECT allowed, remaining FROM rate_limit.acquire('exports', 'tenant_1');

--@ block reference-adaptive
--@ hide
SELECT rate_limit.create_policy('payments', 10, '1 minute', algorithm => 'concurrency',
    options => '{"latency_target": "250 milliseconds", "adaptive_min": 2}');
--@ hide
CREATE TEMP TABLE payment AS SELECT lease FROM rate_limit.acquire('payments', 'acme');
-- the backend answered 503 after 40 ms
SELECT rate_limit.release('payments', 'acme', lease, outcome => 'dropped', latency => '40 ms') FROM payment;
SELECT tokens AS leases FROM rate_limit.buckets WHERE policy = 'payments' AND algorithm = 'adaptive_limit';

--@ block reference-reservations
--@ hide
SELECT rate_limit.create_policy('llm', 100000, '1 day', max_debt => 20000);
--@ hide
CREATE TEMP TABLE call AS SELECT lease AS id FROM rate_limit.reserve('llm', 'tenant_7', 4000);
SELECT allowed, remaining FROM rate_limit.peek('llm', 'tenant_7');
SELECT s.allowed, s.remaining FROM call, rate_limit.settle('llm', 'tenant_7', call.id, 1530) AS s;
SELECT s.allowed, s.remaining FROM call, rate_limit.settle('llm', 'tenant_7', call.id, 1530) AS s;

--@ block reference-meters
--@ hide
SELECT rate_limit.create_policy('gateway', 1000000, '1 day',
    options => '{"meters": {"input": 0.2, "output": 1, "cached_input": 0.05}}');
--@ hide
CREATE TEMP TABLE completion AS
SELECT lease AS id FROM rate_limit.reserve('gateway', 'tenant_7', amounts => '{"input": 1800, "output": 1000}');
-- 1 200 input tokens, 300 more read from the cache, 412 output tokens: 240 + 15 + 412 = 667 tokens
SELECT s.allowed, s.remaining FROM completion,
    rate_limit.settle('gateway', 'tenant_7', completion.id,
                      amounts => '{"input": 1200, "cached_input": 300, "output": 412}') AS s;

--@ block reference-reserve-many
--@ hide
SELECT rate_limit.create_policy('tenant_requests', 60, '1 minute',
    options => '{"meters": {"requests": 1, "input": 0, "output": 0}}');
--@ hide
SELECT rate_limit.create_policy('tenant_tokens', 2000000, '1 day',
    options => '{"meters": {"requests": 0, "input": 0.2, "output": 1}}');
--@ hide
CREATE TEMP TABLE chat AS
SELECT lease AS id FROM rate_limit.reserve_many(ARRAY['tenant_requests', 'tenant_tokens'], 'tenant_7',
    amounts => '{"requests": 1, "input": 1500, "output": 2000}');
-- the call read 1 500 input tokens and wrote 180: 1 request, 300 + 180 = 480 tokens
SELECT s.allowed FROM chat, rate_limit.settle_many(ARRAY['tenant_requests', 'tenant_tokens'], 'tenant_7',
    chat.id, amounts => '{"requests": 1, "input": 1500, "output": 180}') AS s;
SELECT policy, remaining FROM rate_limit.peek('tenant_requests', 'tenant_7')
UNION ALL SELECT policy, remaining FROM rate_limit.peek('tenant_tokens', 'tenant_7');

--@ block reference-bookings
--@ hide
SELECT rate_limit.create_policy('reports', 1, '1 minute', burst => 1, max_debt => 10);
SELECT allowed, retry_after = interval '0' AS now, lease IS NULL AS no_id FROM rate_limit.book('reports', 'tenant_3');
SELECT allowed, ceil(extract(epoch FROM retry_after)) AS come_back_in_seconds FROM rate_limit.book('reports', 'tenant_3');
--@ hide
CREATE TEMP TABLE next_report AS SELECT lease AS id FROM rate_limit.book('reports', 'tenant_3');
SELECT c.allowed AS cancelled FROM next_report, rate_limit.cancel_booking('reports', 'tenant_3', next_report.id) AS c;

--@ block reference-blocks
--@ hide
SELECT rate_limit.create_policy('login', 5, '1 minute', block_after => 3, block_for => '1 hour');
--@ hide
SELECT count(rate_limit.take('login', 'mallory')) FROM generate_series(1, 7);
SELECT allowed, remaining, ceil(extract(epoch FROM retry_after) / 60) AS retry_minutes
FROM rate_limit.take('login', 'mallory');
SELECT rate_limit.unblock('login', 'mallory');
SELECT allowed, ceil(extract(epoch FROM retry_after)) AS retry_s FROM rate_limit.block('login', 'bob', '15 minutes');
SELECT allowed, ceil(extract(epoch FROM retry_after)) AS retry_s FROM rate_limit.take('login', 'bob');

--@ block reference-overrides
--@ hide
SELECT rate_limit.create_policy('search', 2, '1 minute');
--@ hide
SELECT rate_limit.set_override('search', 'partner-42', rate => 100, burst => 20, note => 'plan: partner');
--@ hide
SELECT rate_limit.set_override('search', 'scraper', action => 'deny', until => now() + interval '1 day');
--@ hide
SELECT rate_limit.set_override('search', 'healthcheck', action => 'exempt');
SELECT key, count(*) FILTER (WHERE d.allowed) AS granted, max(d."limit") AS "limit"
FROM unnest(ARRAY['alice', 'partner-42', 'scraper', 'healthcheck']) AS k(key),
     generate_series(1, 30) AS g, LATERAL rate_limit.take('search', k.key || left(g::text, 0)) AS d
GROUP BY key ORDER BY key;
SELECT policy, key, action, rate, per, burst, expires_at IS NOT NULL AS ends, active, note
FROM rate_limit.overrides ORDER BY key;
SELECT rate_limit.clear_override('search', 'scraper');

--@ block reference-shadow
--@ hide
SELECT rate_limit.create_policy('search_v2', 2, '1 hour', shadow => true);
SELECT allowed, remaining, shadow_denied, policy FROM rate_limit.take('search_v2', 'frank', 2);
SELECT allowed, remaining, shadow_denied, policy FROM rate_limit.take('search_v2', 'frank');
SELECT policy, calls, granted, denied FROM rate_limit.stats WHERE policy = 'search_v2';
SELECT rate_limit.alter_policy('search_v2', shadow => false);
SELECT allowed, shadow_denied FROM rate_limit.take('search_v2', 'frank');

--@ block reference-hierarchy
--@ hide
SELECT rate_limit.create_policy('tenant_pool', 100, '1 hour');
--@ hide
SELECT rate_limit.create_policy('tenant_search', 80, '1 hour', options => '{"parent": "tenant_pool"}');
--@ hide
SELECT rate_limit.create_policy('tenant_export', 30, '1 hour', options => '{"parent": "tenant_pool"}');
SELECT allowed, remaining, policy FROM rate_limit.take('tenant_search', 'acme', 70);
SELECT allowed, remaining, policy FROM rate_limit.take('tenant_export', 'acme', 25);
SELECT allowed, remaining, policy FROM rate_limit.take('tenant_search', 'acme', 6);

--@ block reference-charge
--@ hide
SELECT rate_limit.create_policy('llm_tokens', 10000, '1 hour', max_debt => 5000);
SELECT allowed, remaining FROM rate_limit.take('llm_tokens', 'tenant_7', 8000);
SELECT allowed, remaining, retry_after FROM rate_limit.charge('llm_tokens', 'tenant_7', 4500);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'llm_tokens';
SELECT allowed, ceil(extract(epoch FROM retry_after) / 60) AS retry_minutes FROM rate_limit.take('llm_tokens', 'tenant_7');
