-- Every error a caller can meet, with its SQLSTATE. Nothing here writes.

-- 22004 null_value_not_allowed: a NULL argument never returns NULL (which a caller could read as allowed)
SELECT rate_limiting_request(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limiting_request('k', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limiting_request('k', 1, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.peek_request(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.reset_request(NULL);
\echo :LAST_ERROR_SQLSTATE

-- 22023 invalid_parameter_value: refill_per_sec and window_seconds must be at least 1
SELECT rate_limiting_request('k', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limiting_request('k', 2, -60);
\echo :LAST_ERROR_SQLSTATE

-- 22003 numeric_value_out_of_range: the remaining count must fit in int (capacity at most 2^31)
SELECT rate_limiting_request('k', 100000, 100000);
\echo :LAST_ERROR_SQLSTATE

-- 22023: ids longer than 2048 bytes are refused (1 KB ids work)
SELECT rate_limiting_request(repeat('x', 2049));
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.peek_request(repeat('x', 1024)) AS one_kb_id_works;
