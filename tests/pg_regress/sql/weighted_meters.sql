-- Weighted meters: a policy's option meters names the quantities work is measured in and what one unit of
-- each costs in tokens; rate_limit.reserve and rate_limit.settle then take amounts of them instead of
-- tokens, weighed and rounded up to a whole token. Here an LLM gateway's budget: input tokens cost a
-- fifth of output tokens, cached input a twentieth.
BEGIN;
SELECT rate_limit.create_policy('llm_budget', 100000, '1 day', max_debt => 10000,
    options => '{"meters": {"input": 0.2, "output": 1, "cached_input": 0.05}}');
SELECT meters FROM rate_limit.policies WHERE name = 'llm_budget';

-- reserve the prompt's 1 200 input tokens and at most 4 000 output tokens: 240 + 4 000 = 4 240 tokens
SELECT lease AS call_1 FROM rate_limit.reserve('llm_budget', 'tenant_1',
    amounts => '{"input": 1200, "output": 4000}') \gset
SELECT remaining FROM rate_limit.peek('llm_budget', 'tenant_1');
-- the call read 200 of the input from the cache and wrote 310 tokens:
-- 1 000 × 0.2 + 200 × 0.05 + 310 × 1 = 520 tokens; the other 3 720 go back
SELECT allowed, remaining FROM rate_limit.settle('llm_budget', 'tenant_1', :call_1,
    amounts => '{"input": 1000, "cached_input": 200, "output": 310}');
-- 7 input tokens cost 1.4 tokens: rounded up, never down
SELECT lease AS call_2 FROM rate_limit.reserve('llm_budget', 'tenant_1', 10) \gset
SELECT allowed, remaining FROM rate_limit.settle('llm_budget', 'tenant_1', :call_2, amounts => '{"input": 7}');

-- a meter the policy does not have is refused, not settled for free
SAVEPOINT s;
SELECT rate_limit.reserve('llm_budget', 'tenant_1', amounts => '{"inputs": 100}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
ROLLBACK;
