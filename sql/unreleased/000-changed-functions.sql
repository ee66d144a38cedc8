-- Functions whose arguments changed in 0.5.0, dropped before 000-new-functions.sql creates them again:
-- rate_limit.release takes how the call went (outcome, latency) for adaptive concurrency policies.
DROP FUNCTION rate_limit.release(text, text, bigint);
