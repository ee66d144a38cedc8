-- Charges after the fact: rate_limit.charge(policy, key, cost) takes a cost known only once the work is
-- done. It always takes, down to the policy's max_debt tokens below zero (beyond that the cost is
-- forgiven); a bucket in debt denies every take until it has refilled through its debt.
BEGIN;
-- 100 tokens per minute, at most 1000 at once, and up to 500 of debt
SELECT rate_limit.create_policy('llm_tokens', 100, '1 minute', burst => 1000, max_debt => 500);

-- the LLM-token pattern: take an estimate before the call ...
SELECT allowed, remaining FROM rate_limit.take('llm_tokens', 'tenant_1', 800);
-- ... the call used 1 500 tokens: charge the 700 beyond the estimate; 500 of them are debt
SELECT allowed, remaining, retry_after, policy FROM rate_limit.charge('llm_tokens', 'tenant_1', 700);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'llm_tokens';
-- denied while in debt: 501 tokens to refill at 100 per minute, about 5 minutes
SELECT allowed, ceil(extract(epoch FROM retry_after) / 60) AS retry_minutes
FROM rate_limit.take('llm_tokens', 'tenant_1');
-- a further charge cannot go below the floor
SELECT allowed FROM rate_limit.charge('llm_tokens', 'tenant_1', 100000);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'llm_tokens';
-- an estimate above the real use: give the difference back (refund is owner only: GRANT it to the app)
SELECT remaining FROM rate_limit.refund('llm_tokens', 'tenant_1', 1200);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'llm_tokens';

-- with max_debt 0 (the default) a charge empties a bucket at most
SELECT rate_limit.create_policy('no_debt', 10, '1 minute');
SELECT allowed, remaining FROM rate_limit.charge('no_debt', 'k', 25);
SELECT floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'no_debt';

-- in a fixed window the debt is a count above the limit, until the window ends
-- (a century-long window, so that no boundary falls within the test: past rate_limit.max_policy_refill_time)
SET rate_limit.max_policy_refill_time = '36500d';
SELECT rate_limit.create_policy('daily', 10, '36500 days', algorithm => 'fixed_window', max_debt => 5);
SELECT allowed, remaining FROM rate_limit.charge('daily', 'k', 12);
SELECT allowed, retry_after = reset_after AS retry_at_the_next_window FROM rate_limit.take('daily', 'k');

-- bad input: class 22 with a hint
SAVEPOINT bad;
SELECT rate_limit.charge('llm_tokens', 'tenant_1', -1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.charge('llm_tokens', 'tenant_1', NULL);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('bad_debt', 1, '1 minute', max_debt => -1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.alter_policy('daily', max_debt => 2147483647);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;

-- any role may charge, like take; only the owner may refund
CREATE ROLE charger;
SET LOCAL ROLE charger;
SELECT allowed FROM rate_limit.charge('no_debt', 'other', 1);
SAVEPOINT refused;
SELECT rate_limit.refund('no_debt', 'other', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO refused;
ROLLBACK;
