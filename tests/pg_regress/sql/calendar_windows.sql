-- Calendar windows: a quota that resets at dates on a time zone's clocks (every day at midnight, every
-- Monday, the first of each month, a billing day, every 1 January), not every 30 days. Windows start at
-- anchor + k × per, per being whole days or whole months; months clamp to their length (the 31st is the
-- 30th in April), and daylight-saving changes move the instant, never the wall-clock time.
BEGIN;
-- 1 000 calls per calendar month in Paris; the default anchor is the first of the month at 00:00
SELECT rate_limit.create_policy('monthly', 1000, '1 month', algorithm => 'calendar_window',
                                time_zone => 'Europe/Paris');
-- a billing day: the 15th of each month at 00:00 New York time
SELECT rate_limit.create_policy('billing', 3, '1 month', algorithm => 'calendar_window',
                                time_zone => 'America/New_York', anchor => '2026-01-15 00:00');
-- a week from Monday 00:00 UTC (the default zone), a day from midnight in Tokyo, a year from 1 January
SELECT rate_limit.create_policy('weekly', 50, '1 week', algorithm => 'calendar_window');
SELECT rate_limit.create_policy('daily', 20, '1 day', algorithm => 'calendar_window', time_zone => 'asia/tokyo');
SELECT rate_limit.create_policy('yearly', 5, '1 year', algorithm => 'calendar_window');
-- the zone is stored as PostgreSQL names it; a NULL anchor is the start of the unit
SELECT name, algorithm, rate, per, time_zone, anchor FROM rate_limit.policies
WHERE algorithm = 'calendar_window' ORDER BY name;

SELECT allowed, remaining FROM rate_limit.take('billing', 'customer_1', 2);
SELECT allowed, remaining FROM rate_limit.take('billing', 'customer_1');
-- used up until the next 15th at 00:00 in New York, exactly
SELECT allowed, remaining,
       clock_timestamp() + retry_after
         - (CASE WHEN extract(day FROM clock_timestamp() AT TIME ZONE 'America/New_York') >= 15
                 THEN date_trunc('month', clock_timestamp() AT TIME ZONE 'America/New_York') + interval '1 month 14 days'
                 ELSE date_trunc('month', clock_timestamp() AT TIME ZONE 'America/New_York') + interval '14 days'
            END AT TIME ZONE 'America/New_York') BETWEEN interval '-1 second' AND interval '1 second'
         AS retry_at_the_next_billing_day
FROM rate_limit.take('billing', 'customer_1');
-- the HTTP fields: RateLimit-Policy's window is the nominal month (30.436875 days)
SELECT rate_limit.headers(rate_limit.peek('billing', 'customer_1'))->>'RateLimit-Policy' AS policy_field;

-- a new zone or anchor applies from each bucket's next window
SELECT rate_limit.alter_policy('billing', time_zone => 'Europe/Paris');
SELECT time_zone, anchor FROM rate_limit.policies WHERE name = 'billing';
SELECT allowed FROM rate_limit.take('billing', 'customer_1');
-- another algorithm has no calendar
SELECT rate_limit.alter_policy('yearly', per => '365 days', algorithm => 'fixed_window');
SELECT algorithm, time_zone, anchor FROM rate_limit.policies WHERE name = 'yearly';

-- bad input: class 22 with a hint
SAVEPOINT bad;
SELECT rate_limit.create_policy('hourly', 10, '1 hour', algorithm => 'calendar_window');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('mixed', 10, '1 month 1 day', algorithm => 'calendar_window');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('mars', 10, '1 day', algorithm => 'calendar_window', time_zone => 'Mars/Olympus_Mons');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('fraction', 10, '1 day', algorithm => 'calendar_window', anchor => '2026-01-01 00:00:00.5');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('forever', 10, '1 day', algorithm => 'calendar_window', anchor => 'infinity');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('burst', 10, '1 day', burst => 20, algorithm => 'calendar_window');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
-- a zone belongs to calendar windows only; months belong to calendar windows only
SELECT rate_limit.create_policy('zoned', 10, '1 day', time_zone => 'UTC');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('thirty', 10, '1 month', algorithm => 'fixed_window');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
ROLLBACK;
