-- Booked slots: rate_limit.book(policy, key, cost, max_delay) takes a token bucket's tokens first come
-- first served and says when they exist, so that a caller short of tokens sleeps off its connection and
-- comes back then (instead of being denied, or waiting in the backend with rate_limit.wait). Allowed:
-- retry_after is the time to come back (0: now) and lease the booking's id, for
-- rate_limit.cancel_booking(policy, key, booking). How far ahead a key can be booked is the policy's
-- max_debt; how long a caller waits at most is its max_delay (1 day unless given). In the table store both
-- are part of the caller's transaction.
BEGIN;
-- one export an hour per tenant, the first at once, up to 3 booked ahead
SELECT rate_limit.create_policy('exports', 1, '1 hour', burst => 1, max_debt => 3);

-- four bookings: now, then an hour apart (minutes, rounded: the clock moves between calls)
SELECT allowed, round(extract(epoch FROM retry_after) / 60) AS come_back_in_minutes, lease IS NOT NULL AS has_id
FROM rate_limit.book('exports', 'tenant_1');
SELECT allowed, round(extract(epoch FROM retry_after) / 60) AS come_back_in_minutes, lease IS NOT NULL AS has_id
FROM rate_limit.book('exports', 'tenant_1');
SELECT allowed, round(extract(epoch FROM retry_after) / 60) AS come_back_in_minutes, lease IS NOT NULL AS has_id
FROM rate_limit.book('exports', 'tenant_1');
SELECT lease AS last_export FROM rate_limit.book('exports', 'tenant_1') \gset

-- three booked ahead: the queue is full; retry_after says when a booking would fit
SELECT allowed, round(extract(epoch FROM retry_after) / 60) AS retry_in_minutes
FROM rate_limit.book('exports', 'tenant_1');
-- a caller that waits at most 30 minutes: the next slot is 4 hours away, so it may come back in 3.5
SELECT allowed, round(extract(epoch FROM retry_after) / 60) AS retry_in_minutes
FROM rate_limit.book('exports', 'tenant_1', max_delay => '30 minutes');

-- cancelling the last booking gives its slot back, once
SELECT allowed AS cancelled FROM rate_limit.cancel_booking('exports', 'tenant_1', :last_export);
SELECT allowed AS cancelled FROM rate_limit.cancel_booking('exports', 'tenant_1', :last_export);
SELECT allowed, round(extract(epoch FROM retry_after) / 60) AS come_back_in_minutes
FROM rate_limit.book('exports', 'tenant_1');

-- each booking for later is recorded as a reservation held until its time, beside its key's bucket (the
-- cancelled one's is free: a full bucket, which the purge deletes)
SELECT algorithm, tokens > 0 AS held, count(*) FROM rate_limit.buckets WHERE policy = 'exports'
GROUP BY algorithm, held ORDER BY algorithm, held;

-- any role may book and cancel; an id nobody was given cancels nothing
CREATE ROLE booker;
SET LOCAL ROLE booker;
SELECT allowed, round(extract(epoch FROM retry_after) / 60) AS come_back_in_minutes
FROM rate_limit.book('exports', 'tenant_2');
SELECT allowed AS cancelled FROM rate_limit.cancel_booking('exports', 'tenant_2', 12345);
RESET ROLE;

-- bad input: class 22 with a hint; only a token bucket books (42809)
SELECT rate_limit.create_policy('daily', 10, '1 day', algorithm => 'fixed_window');
SAVEPOINT bad;
SELECT rate_limit.book('exports', 'k', 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.book('exports', 'k', 1, max_delay => '2 days');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.cancel_booking('exports', 'k', NULL);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.book('daily', 'k');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
ROLLBACK;
