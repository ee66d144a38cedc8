-- State written by rate_limit 0.1.0 before the upgrade, and the rows 0.2.0 and later must hold for it.
-- Every limit refills over 1000 days, so the whole tokens cannot change while the test runs.
SELECT rate_limit.create_policy('up_tokens', 5, '1000 days', 10);
SELECT rate_limit.create_policy('up_window', 3, '1000 days', 3, 'fixed_window', 'table');
SELECT (rate_limit.take('up_tokens', 'alice', 4)).allowed;
SELECT (rate_limit.take('up_window', 'bob', 2)).allowed;
SELECT (rate_limit.take('adhoc-key', 7, '1000 days', 7, 3)).allowed;
SELECT rate_limiting_request('carol', 1, 100000), rate_limiting_request('carol', 1, 100000);

CREATE TABLE public.expected_policies AS SELECT * FROM rate_limit.policies;
CREATE TABLE public.expected_buckets AS
SELECT '#request'::text AS namespace, id AS key, level, updated_at, 'token_bucket'::text AS algorithm,
       refill_per_sec::bigint AS rate, 1000000::bigint AS per_us, capacity AS burst
FROM rate_limit.bucket_state
UNION ALL
SELECT CASE policy WHEN '' THEN '#ad_hoc' ELSE policy END, key, level, updated_at, algorithm, rate, per_us, burst
FROM rate_limit.policy_state;
-- whole tokens left in the policy buckets, as the API reports them after the upgrade
CREATE TABLE public.expected_remaining (policy text, key text, remaining bigint);
INSERT INTO public.expected_remaining VALUES ('up_tokens', 'alice', 6), ('up_window', 'bob', 1);
