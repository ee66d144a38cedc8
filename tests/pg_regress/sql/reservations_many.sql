-- Reservations over several limits: an LLM gateway allows each tenant 3 requests a minute and 10 000
-- tokens a day. rate_limit.reserve_many reserves one call under both policies at once, all or nothing,
-- with one id; rate_limit.settle_many settles each on what it counts. Amounts are weighed by each
-- policy's own meters: the requests policy counts the request, the tokens policy the tokens.
BEGIN;
SELECT rate_limit.create_policy('llm_requests', 3, '1 minute',
    options => '{"meters": {"requests": 1, "input": 0, "output": 0}}');
SELECT rate_limit.create_policy('llm_tokens', 10000, '1 day', max_debt => 5000,
    options => '{"meters": {"requests": 0, "input": 0.5, "output": 1}}');

-- a call with a 2 000-token prompt that may write 4 000: 1 request, 1 000 + 4 000 = 5 000 tokens
SELECT allowed, policy, remaining, lease AS call_1
FROM rate_limit.reserve_many(ARRAY['llm_requests', 'llm_tokens'], 'tenant_1',
    amounts => '{"requests": 1, "input": 2000, "output": 4000}') \gset
SELECT :'allowed' AS allowed, :'policy' AS policy, :'remaining' AS remaining;
-- it wrote 600 tokens: 1 000 + 600 = 1 600 used, the other 3 400 go back; the request stays counted
SELECT allowed, policy, remaining FROM rate_limit.settle_many(ARRAY['llm_requests', 'llm_tokens'], 'tenant_1',
    :call_1, amounts => '{"requests": 1, "input": 2000, "output": 600}');
SELECT policy, remaining FROM rate_limit.peek('llm_requests', 'tenant_1')
UNION ALL SELECT policy, remaining FROM rate_limit.peek('llm_tokens', 'tenant_1');
-- settled once: a retry changes nothing
SELECT allowed FROM rate_limit.settle_many(ARRAY['llm_requests', 'llm_tokens'], 'tenant_1', :call_1,
    amounts => '{"requests": 1, "input": 2000, "output": 600}');

-- in tokens: one estimate per policy, in their order; a call the tokens policy cannot cover is denied
-- by it, and takes no request either
SELECT allowed, policy, lease IS NULL AS no_id
FROM rate_limit.reserve_many(ARRAY['llm_requests', 'llm_tokens'], 'tenant_1', ARRAY[1, 9000]);
SELECT remaining FROM rate_limit.peek('llm_requests', 'tenant_1');

-- an estimate must be at least 1 token under every policy: these amounts cost the requests policy 0
SAVEPOINT s;
SELECT rate_limit.reserve_many(ARRAY['llm_requests', 'llm_tokens'], 'tenant_1', amounts => '{"input": 10}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
ROLLBACK;
