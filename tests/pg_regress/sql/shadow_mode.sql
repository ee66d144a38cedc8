-- Shadow mode: a policy that never denies. Its buckets are evaluated and take their tokens like any
-- other; a call it would have denied goes through, with shadow_denied = true in the decision, and counts
-- as denied in rate_limit.stats and rate_limit.top_limited. Watch a new limit before enforcing it.
BEGIN;
SELECT rate_limit.create_policy('new_limit', 2, '1 day', shadow => true);
SELECT name, shadow FROM rate_limit.policies WHERE name = 'new_limit';

-- two grants, then would-be denials: allowed, reported, nothing taken
SELECT allowed, remaining, shadow_denied, policy FROM rate_limit.take('new_limit', 'alice');
SELECT allowed, remaining, shadow_denied, policy FROM rate_limit.take('new_limit', 'alice');
SELECT allowed, remaining, retry_after, shadow_denied, policy FROM rate_limit.take('new_limit', 'alice');
SELECT allowed, shadow_denied FROM rate_limit.take('new_limit', 'alice');

-- counted: 4 calls, 2 granted, 2 (would-be) denied, and alice on top of the denied keys
SELECT calls, granted, denied FROM rate_limit.stats WHERE policy = 'new_limit';
SELECT rank, key, denials FROM rate_limit.top_limited WHERE policy = 'new_limit';

-- with an enforced limit: the call is decided by the enforced one; the shadow one only reports
SELECT rate_limit.create_policy('live_limit', 10, '1 day');
SELECT allowed, remaining, shadow_denied, policy
FROM rate_limit.take_many(ARRAY['live_limit', 'new_limit'], ARRAY['alice']);
SELECT remaining FROM rate_limit.peek('live_limit', 'alice');

-- enforcing it is one call, effective for every session's next transaction
SELECT rate_limit.alter_policy('new_limit', shadow => false);
SELECT allowed, shadow_denied, policy FROM rate_limit.take('new_limit', 'alice');
-- ... and the enforced denial is not taken from the other policy's bucket either
SELECT allowed, policy FROM rate_limit.take_many(ARRAY['live_limit', 'new_limit'], ARRAY['alice']);
SELECT remaining FROM rate_limit.peek('live_limit', 'alice');
ROLLBACK;

-- rate_limit.shadow puts every limit in shadow mode (policies, ad-hoc limits, rate_limiting_request): the
-- switch for an incident. Only a superuser may set it, so that no role can lift its own limits.
BEGIN;
SELECT rate_limit.create_policy('strict', 1, '1 day');
SELECT allowed FROM rate_limit.take('strict', 'bob');
SELECT allowed FROM rate_limit.take('strict', 'bob');
SET LOCAL rate_limit.shadow = on;
SELECT allowed, shadow_denied FROM rate_limit.take('strict', 'bob');
SELECT rate_limiting_request('shadow_demo', 1, 1) AS first,
       rate_limiting_request('shadow_demo', 1, 1) AS second_not_refused;
SET LOCAL rate_limit.shadow = off;
CREATE ROLE shadow_seeker;
SET LOCAL ROLE shadow_seeker;
SAVEPOINT refused;
SET rate_limit.shadow = on;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO refused;
SELECT allowed FROM rate_limit.take('strict', 'bob');
ROLLBACK;
