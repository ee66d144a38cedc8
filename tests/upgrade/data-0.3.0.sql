-- State written by rate_limit 0.3.0 before an upgrade (the same rows as 0.2.0: the state table did not change).
-- Every limit refills over 1000 days, so the whole tokens cannot change while the test runs.
SELECT rate_limit.create_policy('up_tokens', 5, '1000 days', 10);
SELECT rate_limit.create_policy('up_window', 3, '1000 days', 3, 'fixed_window', 'table');
SELECT (rate_limit.take('up_tokens', 'alice', 4)).allowed;
SELECT (rate_limit.take('up_window', 'bob', 2)).allowed;
SELECT (rate_limit.take_ad_hoc('adhoc-key', 7, '1000 days', 7, 3)).allowed;
SELECT rate_limiting_request('carol', 1, 100000), rate_limiting_request('carol', 1, 100000);

CREATE TABLE public.expected_policies AS SELECT * FROM rate_limit.policies;
CREATE TABLE public.expected_buckets AS SELECT * FROM rate_limit.bucket_state;
CREATE TABLE public.expected_remaining (policy text, key text, remaining bigint);
INSERT INTO public.expected_remaining VALUES ('up_tokens', 'alice', 6), ('up_window', 'bob', 1);
