-- The table store is transactional: consumption is part of the caller's transaction.
BEGIN;
SELECT rate_limiting_request('tx', 1, 10) AS remaining;
SAVEPOINT before_two_calls;
SELECT rate_limiting_request('tx', 1, 10) AS remaining;
SELECT rate_limiting_request('tx', 1, 10) AS remaining;
ROLLBACK TO SAVEPOINT before_two_calls;
-- the two rolled-back tokens are back
SELECT rate_limiting_request('tx', 1, 10) AS remaining;
ROLLBACK;

-- In a read-only transaction a denial still works (it writes nothing), but a grant cannot be recorded.
SELECT rate_limiting_request('ro', 1, 1) AS remaining;
BEGIN READ ONLY;
SELECT rate_limiting_request('ro', 1, 1) AS denied_without_writing;
ROLLBACK;
BEGIN READ ONLY;
SELECT rate_limiting_request('never_seen', 1, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT rate_limit.reset_request('ro') AS cleaned_up;
