-- Security model, seen by a role without privileges: it may take and peek tokens; it may not reset, purge,
-- list ids or touch the storage table; and its own look-alike objects cannot redirect the extension.
BEGIN;
CREATE ROLE rl_app NOLOGIN;
CREATE SCHEMA rl_app_schema AUTHORIZATION rl_app;
SELECT rate_limiting_request('victim', 1, 10) FROM generate_series(1, 10);   -- drained by the owner
SET ROLE rl_app;

SELECT rate_limiting_request('app', 1, 10) AS allowed, rate_limit.peek_request('app', 1, 10) AS peek_allowed;

SAVEPOINT s;
SELECT rate_limit.reset_request('victim');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
SELECT rate_limit.purge();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
SELECT count(*) FROM rate_limit.buckets;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
UPDATE rate_limit.bucket_state SET level = 10000000 WHERE key = 'victim';
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;

-- search_path hijack attempt: look-alike table, function and an "=" that matches everything, in the
-- role's own schema, searched before pg_catalog
CREATE TABLE rl_app_schema.bucket_state (namespace text, key text, level bigint, updated_at timestamptz,
                                         algorithm text, rate bigint, per_us bigint, burst bigint);
CREATE FUNCTION rl_app_schema.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR rl_app_schema.= (LEFTARG = text, RIGHTARG = text, FUNCTION = rl_app_schema.always);
CREATE FUNCTION rl_app_schema.clock_timestamp() RETURNS timestamptz LANGUAGE sql
    AS $$ SELECT timestamptz '2999-01-01' $$;
SET search_path = rl_app_schema, public, pg_catalog;
SELECT rate_limiting_request('victim', 1, 10) AS still_denied;
SELECT public.rate_limiting_request('app', 1, 10) AS counts_on;
SELECT count(*) AS rows_in_lookalike FROM rl_app_schema.bucket_state;
RESET search_path;

-- the owner may delegate management
RESET ROLE;
GRANT EXECUTE ON FUNCTION rate_limit.reset_request(text) TO rl_app;
SET ROLE rl_app;
SELECT rate_limit.reset_request('victim') AS reset_by_grantee;
RESET ROLE;
ROLLBACK;
