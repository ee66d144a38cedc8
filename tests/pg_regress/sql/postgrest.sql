-- The PostgREST recipe from the README: a pre-request function that limits every request, GET requests
-- (read-only transactions in PostgREST) through the memory store, writes through the table store, and
-- answers 429 with the RateLimit fields when the limit is hit. PostgREST sets request.method and
-- request.headers for each request; here they are set by hand.
SELECT rate_limit.create_policy('rest_read', 2, '1 minute', store => 'memory');
SELECT rate_limit.create_policy('rest_write', 1, '1 minute', store => 'table');

CREATE FUNCTION check_rate_limit() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  policy text := CASE WHEN current_setting('request.method', true) IN ('GET', 'HEAD')
                      THEN 'rest_read' ELSE 'rest_write' END;
  client text := coalesce(current_setting('request.headers', true)::json ->> 'x-forwarded-for', 'anonymous');
  d rate_limit.decision;
BEGIN
  SELECT * INTO d FROM rate_limit.take(policy, client);
  IF NOT d.allowed THEN
    RAISE SQLSTATE 'PT429' USING
      MESSAGE = 'Too Many Requests',
      DETAIL = rate_limit.headers(d)::text,
      HINT = format('Retry in %s seconds.', ceil(extract(epoch FROM d.retry_after)));
  END IF;
END $$;

SET request.method = 'GET';
SET request.headers = '{"x-forwarded-for": "203.0.113.7"}';
BEGIN READ ONLY;
SELECT check_rate_limit();
SELECT check_rate_limit();
SELECT check_rate_limit();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

SET request.method = 'POST';
SELECT check_rate_limit();
SELECT check_rate_limit();
\echo :LAST_ERROR_SQLSTATE

RESET request.method;
RESET request.headers;
DROP FUNCTION check_rate_limit();
SELECT rate_limit.drop_policy('rest_read'), rate_limit.drop_policy('rest_write');
