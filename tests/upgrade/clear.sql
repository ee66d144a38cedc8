-- Removes what the upgrade test wrote, so that the examples run in the updated database as in a new one.
SELECT rate_limit.drop_policy(name) FROM rate_limit.policies;
SELECT rate_limit.reset_request('carol'), rate_limit.reset_ad_hoc('adhoc-key');
DROP TABLE public.expected_policies, public.expected_buckets, public.expected_remaining;
