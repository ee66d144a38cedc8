-- Every error of the policy API, with its SQLSTATE. Nothing here takes a token.
SELECT rate_limit.create_policy('err', 5, '1 second');

-- 22004: NULL arguments
SELECT * FROM rate_limit.take(NULL, 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take('err', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take('err', 'k', NULL::int);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take_ad_hoc('k', NULL, '1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take_many(ARRAY['err', NULL], ARRAY['k']);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 1, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 1, '1 second', algorithm => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 1, '1 second', shadow => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 1, '1 second', max_debt => NULL);
\echo :LAST_ERROR_SQLSTATE
-- a decision with no answer prints no headers
SELECT rate_limit.headers(ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::rate_limit.decision);
\echo :LAST_ERROR_SQLSTATE

-- 22023: a decision no call returns (negative numbers)
SELECT rate_limit.headers(ROW(false, -5, -1, '-1 s', '-1 s', 'hp', false, NULL)::rate_limit.decision);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.headers(ROW(false, 0, 5, '-1 s', '1 s', NULL, false, NULL)::rate_limit.decision);
\echo :LAST_ERROR_SQLSTATE
-- 22023: a calendar window longer than 100 years (its length would overflow)
SELECT rate_limit.create_policy('calwrap', 2, '213503983 days', algorithm => 'calendar_window');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('calwrap', 2, '584542 years 1 mon', algorithm => 'calendar_window');
\echo :LAST_ERROR_SQLSTATE
-- 22023: a policy whose buckets could stay short longer than rate_limit.max_policy_refill_time (400 days)
SELECT rate_limit.create_policy('dbig', 1, '1 second', max_debt => 9223372036854);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('pbig', 5, '1 minute', block_after => 3, block_for => '36524 days');
\echo :LAST_ERROR_SQLSTATE

-- 42704: unknown policy; 42710: a policy that exists already
SELECT * FROM rate_limit.take('nope', 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('err', 1, '1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.alter_policy('nope', 1);
\echo :LAST_ERROR_SQLSTATE

-- 22023: values out of range
SELECT * FROM rate_limit.take('err', 'k', -1);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('bad name', 1, '1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 0, '1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 1, '1 month');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 1, '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 5, '1 minute', 10, 'fixed_window');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 5, '1 minute', algorithm => 'leaky_bucket');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 5, '1 minute', store => 'redis');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.create_policy('x', 9223372036854775807, '1 day', 9223372036854775807);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take_many(ARRAY[]::text[], ARRAY['k']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take_many(ARRAY['err', 'err'], ARRAY['k']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take_many(ARRAY['err'], ARRAY['a', 'b']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.take_ad_hoc(repeat('k', 2049), 1, '1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.refund('err', 'k', -1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.wait('err', 'k', 1, '-1 second');
\echo :LAST_ERROR_SQLSTATE

-- 0A000: the policies of one call must share a store
SELECT rate_limit.create_policy('err_mem', 5, '1 second', store => 'memory');
SELECT * FROM rate_limit.take_many(ARRAY['err', 'err_mem'], ARRAY['k']);
\echo :LAST_ERROR_SQLSTATE
-- 25006: the table store cannot record a grant in a read-only transaction (denials and peeks work)
BEGIN READ ONLY;
SELECT allowed FROM rate_limit.peek('err', 'ro');
SELECT * FROM rate_limit.take('err', 'ro');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- Permissions: anyone may take, peek, wait and read the policies; only the owner manages them
CREATE ROLE rate_limit_policy_caller;
SET ROLE rate_limit_policy_caller;
SELECT allowed FROM rate_limit.take('err', 'from_caller');
SELECT name FROM rate_limit.policies WHERE name = 'err';
SELECT rate_limit.create_policy('mine', 1, '1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.alter_policy('err', 100);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.drop_policy('err');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM rate_limit.refund('err', 'from_caller', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT rate_limit.reset('err', 'from_caller');
\echo :LAST_ERROR_SQLSTATE
UPDATE rate_limit.policies SET rate = 1000;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM rate_limit.bucket_state;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE rate_limit_policy_caller;
SELECT rate_limit.drop_policy('err'), rate_limit.drop_policy('err_mem');
