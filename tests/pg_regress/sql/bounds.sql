-- What a role with no privileges cannot make the server hold: a limit it chooses itself (ad hoc, or
-- rate_limiting_request's) must refill within rate_limit.max_refill_time (a day by default), so that every
-- bucket it makes is full, and purged, soon after its last call.
BEGIN;
CREATE ROLE rl_bounded NOLOGIN;
SET ROLE rl_bounded;

-- a limit that refills within a day is anyone's; a slower one is the owner's (named policies)
SELECT allowed FROM rate_limit.take_ad_hoc('bounds_ip', 100, '1 day');
SAVEPOINT s;
SELECT allowed FROM rate_limit.take_ad_hoc('bounds_ip', 1, '36500000 days');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
SELECT rate_limiting_request('bounds_id', 1, 2147483647);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
