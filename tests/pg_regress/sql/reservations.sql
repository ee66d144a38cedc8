-- Reservations: rate_limit.reserve(policy, key, estimate, hold) takes an estimate before work whose cost is
-- known only after it (the tokens of an LLM call) and returns the reservation's id in lease;
-- rate_limit.settle(policy, key, reservation, actual) gives back what was reserved and not used, or charges
-- what was used beyond it (down to the policy's max_debt), once. A reservation not settled within its hold
-- (5 minutes unless given) is settled at its estimate. In the table store both are part of the caller's
-- transaction; in the memory store a settle is applied when its transaction commits.
BEGIN;
-- 10 000 tokens a day, and up to 5 000 of debt
SELECT rate_limit.create_policy('llm_tokens', 10000, '1 day', max_debt => 5000);

-- reserve 3 000 tokens for a call
SELECT lease AS call_1 FROM rate_limit.reserve('llm_tokens', 'tenant_1', 3000) \gset
SELECT remaining FROM rate_limit.peek('llm_tokens', 'tenant_1');
-- the call used 1 200: the settle gives the other 1 800 back
SELECT allowed, remaining, lease = :call_1 AS settled_it FROM rate_limit.settle('llm_tokens', 'tenant_1', :call_1, 1200);
-- a second settle of the same reservation changes nothing (allowed false)
SELECT allowed, remaining FROM rate_limit.settle('llm_tokens', 'tenant_1', :call_1, 0);

-- a call that used more than its estimate: the excess is charged, into debt
SELECT lease AS call_2 FROM rate_limit.reserve('llm_tokens', 'tenant_1', 8000) \gset
SELECT allowed, remaining FROM rate_limit.settle('llm_tokens', 'tenant_1', :call_2, 10000);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets
WHERE policy = 'llm_tokens' AND algorithm <> 'reservation';
-- while in debt a reserve is denied, and gets no id
SELECT allowed, lease IS NULL AS no_id FROM rate_limit.reserve('llm_tokens', 'tenant_1', 1);

-- rate_limit.buckets lists a held reservation beside its key's bucket: its tokens the estimate, its per
-- the hold
SELECT rate_limit.create_policy('chat', 10, '1 day');
SELECT lease AS call_3 FROM rate_limit.reserve('chat', 'k', 4, hold => '2 minutes') \gset
SELECT algorithm, floor(tokens) AS tokens, per FROM rate_limit.buckets WHERE policy = 'chat' ORDER BY algorithm;
-- a settle that rolls back is not applied: the reservation is still there to settle
SAVEPOINT before_settle;
SELECT allowed, remaining FROM rate_limit.settle('chat', 'k', :call_3, 0);
ROLLBACK TO SAVEPOINT before_settle;
SELECT remaining FROM rate_limit.peek('chat', 'k');
SELECT allowed, remaining FROM rate_limit.settle('chat', 'k', :call_3, 1);

-- not settled within its hold: settled at its estimate, and a late settle gives nothing back
SELECT lease AS call_4 FROM rate_limit.reserve('chat', 'k', 2, hold => '10 ms') \gset
SELECT pg_sleep(0.05);
SELECT allowed, remaining FROM rate_limit.settle('chat', 'k', :call_4, 0);

-- any role may reserve and settle: a settle needs the reservation's id, and gives back at most what that
-- reservation took; an id nobody was given settles nothing
CREATE ROLE reserver;
SET LOCAL ROLE reserver;
SELECT lease AS call_5 FROM rate_limit.reserve('chat', 'other', 5) \gset
SELECT allowed, remaining FROM rate_limit.settle('chat', 'other', :call_5, 0);
SELECT allowed, remaining FROM rate_limit.settle('chat', 'other', 12345, 0);
RESET ROLE;

-- bad input: class 22 with a hint
SAVEPOINT bad;
SELECT rate_limit.reserve('chat', 'k', 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.reserve('chat', 'k', 1, hold => '2 days');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.settle('chat', 'k', NULL, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.settle('chat', 'k', :call_3, -1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
ROLLBACK;
