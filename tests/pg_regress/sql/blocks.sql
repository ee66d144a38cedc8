-- Blocks: a key denied outright for a while, without its bucket being touched. By hand, with
-- rate_limit.block(policy, key, duration) and rate_limit.unblock (owner only); or by a policy's penalty
-- box: block_after denials of a key within one window (per) block it for block_for.
BEGIN;
-- 3 calls per minute; 2 denials within a minute block the key for an hour
SELECT rate_limit.create_policy('login', 3, '1 minute', block_after => 2, block_for => '1 hour');
SELECT block_after, block_for FROM rate_limit.policies WHERE name = 'login';

-- three grants, then two denials: the second one starts the block
SELECT (rate_limit.take('login', 'mallory')).remaining FROM generate_series(1, 3);
SELECT allowed, retry_after < interval '1 minute' AS waits_for_a_token FROM rate_limit.take('login', 'mallory');
SELECT allowed, retry_after > interval '59 minutes' AS waits_for_the_block FROM rate_limit.take('login', 'mallory');
-- blocked: denied with the block's end, whatever the bucket holds (peek says so too)
SELECT allowed, remaining, retry_after > interval '59 minutes' AS blocked_for_an_hour
FROM rate_limit.peek('login', 'mallory');
-- the block bucket is listed with the key's bucket, under its policy: no denial tolerated while blocked
SELECT algorithm, key, floor(tokens) AS tokens FROM rate_limit.buckets WHERE policy = 'login' ORDER BY algorithm;
-- other keys are not affected
SELECT allowed FROM rate_limit.take('login', 'alice');

-- lifting the block: true once, and the key's bucket is as the block found it (still short)
SELECT rate_limit.unblock('login', 'mallory');
SELECT rate_limit.unblock('login', 'mallory');
SELECT allowed, retry_after < interval '1 minute' AS waits_for_a_token FROM rate_limit.take('login', 'mallory');

-- blocks by hand work on every policy, with or without a penalty box, and replace an earlier block
SELECT rate_limit.create_policy('svc', 100, '1 second');
SELECT allowed, remaining, extract(epoch FROM retry_after)::int AS retry_s FROM rate_limit.block('svc', 'bob', '15 minutes');
SELECT allowed, extract(epoch FROM retry_after) <= 900 AS within_15_minutes FROM rate_limit.take('svc', 'bob');
SELECT extract(epoch FROM retry_after)::int AS retry_s FROM rate_limit.block('svc', 'bob', '2 minutes');
-- the HTTP fields of a blocked key's decision: Retry-After is the block's end
SELECT rate_limit.headers(d) ->> 'Retry-After' AS retry_after FROM rate_limit.take('svc', 'bob') AS d;
-- limit_writes refuses a blocked key's writes (53400), and lets the others through
CREATE TEMP TABLE posts (author text, body text);
CREATE TRIGGER posts_limited BEFORE INSERT ON posts
    FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('svc', 'author');
SAVEPOINT write;
\set VERBOSITY terse
INSERT INTO posts VALUES ('bob', 'hello');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
ROLLBACK TO write;
INSERT INTO posts VALUES ('alice', 'hello');
SELECT author FROM posts;
-- a multi-limit call on a blocked key is denied by the block, taking nothing from the other bucket
SELECT allowed, policy FROM rate_limit.take_many(ARRAY['login', 'svc'], ARRAY['bob']);
SELECT remaining FROM rate_limit.peek('login', 'bob');
-- removing the penalty box keeps the blocks already started
SELECT rate_limit.alter_policy('login', block_after => 0);
SELECT block_after, block_for FROM rate_limit.policies WHERE name = 'login';

-- bad input: class 22 with a hint
SAVEPOINT bad;
SELECT rate_limit.create_policy('bad', 1, '1 minute', block_after => 3);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('bad', 1, '1 minute', block_after => 0, block_for => '1 hour');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('bad', 1, '1 minute', block_after => 1, block_for => '-1 hour');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.block('svc', 'bob', NULL);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.block('svc', 'bob', '1 month');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.block('svc', 'bob', '40000 days');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.block('no_such_policy', 'bob', '1 hour');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;
SELECT rate_limit.create_policy('bad', 1, '1 minute', algorithm => 'block');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO bad;

-- a role with only LOGIN may take (and so be blocked), but neither block nor unblock anyone
CREATE ROLE visitor LOGIN;
SET LOCAL ROLE visitor;
SELECT allowed FROM rate_limit.take('svc', 'visitor');
SAVEPOINT refused;
SELECT rate_limit.block('svc', 'alice', '1 hour');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO refused;
SELECT rate_limit.unblock('svc', 'bob');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO refused;
ROLLBACK;
