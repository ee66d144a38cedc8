-- Shadow mode: a policy that never denies. Its buckets are evaluated and take their tokens like any
-- other; a call it would have denied goes through, with shadow_denied = true in the decision (and, in the
-- compiled edition, counts as denied in the statistics: shadow_switch.sql). Watch a new limit before
-- enforcing it.
BEGIN;
SELECT rate_limit.create_policy('new_limit', 2, '1 day', shadow => true);
SELECT name, shadow FROM rate_limit.policies WHERE name = 'new_limit';

-- two grants, then would-be denials: allowed, reported, nothing taken
SELECT allowed, remaining, shadow_denied, policy FROM rate_limit.take('new_limit', 'alice');
SELECT allowed, remaining, shadow_denied, policy FROM rate_limit.take('new_limit', 'alice');
SELECT allowed, remaining, retry_after, shadow_denied, policy FROM rate_limit.take('new_limit', 'alice');
SELECT allowed, shadow_denied FROM rate_limit.take('new_limit', 'alice');

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
