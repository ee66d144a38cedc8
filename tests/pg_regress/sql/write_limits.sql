-- Limiting writes with a trigger: at most 2 comments per author per day. The third insert of an author
-- fails with SQLSTATE 53400; its DETAIL carries the RateLimit header values and its HINT the wait.
BEGIN;
SELECT rate_limit.create_policy('comments_per_author', 2, '1 day');
CREATE TABLE comments (id int GENERATED ALWAYS AS IDENTITY, author_id int, body text NOT NULL);
CREATE TRIGGER comments_rate_limit BEFORE INSERT ON comments
    FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('comments_per_author', 'author_id');

INSERT INTO comments (author_id, body) VALUES (1, 'first'), (1, 'second');
INSERT INTO comments (author_id, body) VALUES (2, 'another author');
SAVEPOINT third;
\set VERBOSITY terse
INSERT INTO comments (author_id, body) VALUES (1, 'third');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
ROLLBACK TO third;
SELECT author_id, body FROM comments ORDER BY id;

-- The DETAIL and HINT of the refusal (their numbers depend on the clock, so they are checked by pattern)
DO $$
DECLARE
  detail text;
  hint text;
BEGIN
  INSERT INTO comments (author_id, body) VALUES (1, 'fourth');
EXCEPTION WHEN configuration_limit_exceeded THEN
  GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
  RAISE WARNING 'detail matches: %', detail ~ '^RateLimit: "comments_per_author";r=0;t=\d+, RateLimit-Policy: "comments_per_author";q=2;w=86400, Retry-After: \d+$';
  RAISE WARNING 'hint matches: %', hint ~ '^Retry after \d+ second\(s\)';
END $$;

-- Misuse is refused with 39P01 (trigger protocol) or 42703 (no such column), and a NULL key with 22004.
CREATE TRIGGER wrong_column BEFORE UPDATE ON comments
    FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('comments_per_author', 'user_id');
SAVEPOINT misuse;
UPDATE comments SET body = body || '!' WHERE author_id = 2;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO misuse;
DROP TRIGGER wrong_column ON comments;
CREATE TRIGGER too_late AFTER INSERT ON comments
    FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('comments_per_author', 'author_id');
SAVEPOINT misuse;
INSERT INTO comments (author_id, body) VALUES (3, 'checked after the fact');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO misuse;
DROP TRIGGER too_late ON comments;
INSERT INTO comments (author_id, body) VALUES (NULL, 'anonymous');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
