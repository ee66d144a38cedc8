-- State written by rate_limit 0.4.0 before an upgrade: the rows of 0.3.0, over 100 days instead of 1000 (0.4.0
-- refuses a policy whose buckets take longer than rate_limit.max_policy_refill_time, 400 days, to refill).
-- Whole tokens still cannot change while the test runs.
SELECT rate_limit.create_policy('up_tokens', 5, '100 days', 10);
SELECT rate_limit.create_policy('up_window', 3, '100 days', 3, 'fixed_window', 'table');
SELECT (rate_limit.take('up_tokens', 'alice', 4)).allowed;
SELECT (rate_limit.take('up_window', 'bob', 2)).allowed;
SELECT (rate_limit.take_ad_hoc('adhoc-key', 7, '100 days', 7, 3)).allowed;
SELECT rate_limiting_request('carol', 1, 100000), rate_limiting_request('carol', 1, 100000);

CREATE TABLE public.expected_policies AS
    SELECT name, algorithm, rate, per, burst, store, created_at, changed_at FROM rate_limit.policies;
CREATE TABLE public.expected_buckets AS SELECT * FROM rate_limit.bucket_state;
CREATE TABLE public.expected_remaining (policy text, key text, remaining bigint);
INSERT INTO public.expected_remaining VALUES ('up_tokens', 'alice', 6), ('up_window', 'bob', 1);
