-- Moves a database from the portable edition to the compiled one, keeping its policies, overrides and
-- buckets: run by a superuser where rate_limit's library is installed, in one transaction:
--   psql -v ON_ERROR_STOP=1 -1 -d DATABASE -f to-compiled.sql
-- The two editions' tables have the same columns, so the rows are copied as they are: every bucket keeps
-- its tokens, every override and block its end. The compiled edition is created in the schema that held
-- the portable edition's rate_limiting_request. What does not move: privileges the owner granted on the
-- portable edition's functions (grant them again: the compiled edition's owner-only functions belong to
-- the role that ran this script), and the portable edition's settings functions (rate_limit.max_wait() and
-- the others; the compiled edition's are superuser settings of the same names).
CREATE TEMPORARY TABLE rl_move_policies AS SELECT * FROM rate_limit.policies;
CREATE TEMPORARY TABLE rl_move_overrides AS SELECT * FROM rate_limit.key_overrides;
CREATE TEMPORARY TABLE rl_move_buckets AS SELECT * FROM rate_limit.bucket_state;
DO $$
DECLARE
    request_schema name;
    f regprocedure;
BEGIN
    -- the portable edition's rate_limiting_request: the one whose fast path calls its rate_limit._request
    SELECT n.nspname INTO request_schema
      FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
     WHERE p.proname OPERATOR(pg_catalog.=) 'rate_limiting_request' AND p.prosrc LIKE '%rate_limit._request(%';
    IF request_schema IS NULL THEN
        RAISE EXCEPTION 'the portable edition of rate_limit is not installed in this database';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limit_portable') THEN
        DROP EXTENSION rate_limit_portable;
    ELSE
        FOR f IN SELECT p.oid FROM pg_catalog.pg_proc AS p
                  WHERE p.proname OPERATOR(pg_catalog.=) 'rate_limiting_request'
                    AND p.prosrc LIKE '%rate_limit._request(%' LOOP
            EXECUTE pg_catalog.format('DROP FUNCTION %s', f);
        END LOOP;
        DROP SCHEMA rate_limit CASCADE;
    END IF;
    EXECUTE pg_catalog.format('CREATE EXTENSION rate_limit SCHEMA %I', request_schema);
END
$$;
INSERT INTO rate_limit.policies (name, algorithm, rate, per, burst, store, created_at, changed_at, shadow,
    max_debt, time_zone, anchor, block_after, block_for, blocks_by_hand, description, adaptive_min,
    latency_target, meters, parent)
SELECT name, algorithm, rate, per, burst, store, created_at, changed_at, shadow, max_debt, time_zone, anchor,
       block_after, block_for, blocks_by_hand, description, adaptive_min, latency_target, meters, parent
FROM rl_move_policies;
INSERT INTO rate_limit.key_overrides (policy, key, action, rate, per, burst, expires_at, set_at, note)
SELECT policy, key, action, rate, per, burst, expires_at, set_at, note FROM rl_move_overrides;
INSERT INTO rate_limit.bucket_state (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
SELECT namespace, key, level, updated_at, algorithm, rate, per_us, burst FROM rl_move_buckets;
DROP TABLE rl_move_policies, rl_move_overrides, rl_move_buckets;
