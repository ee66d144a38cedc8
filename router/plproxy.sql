-- rate_limit behind a PL/Proxy router (docs/scaling.md#plproxy).
--
-- Run this file in the router database, as a superuser, then create the router:
--
--   psql -d router -f router/plproxy.sql
--   SELECT rate_limit_router.create_router('rate_limit',
--            ARRAY['host=db0 dbname=app', 'host=db1 dbname=app'], on_partition_down => 'fail_closed',
--            timeout => '2 seconds');
--
-- Every partition is a database with the rate_limit extension (version 0.4.0 or later). The router database
-- has PL/Proxy and NOT the extension (it loads rate_limit's library, from the package, for the deadline of
-- its calls only): it gets functions with the extension's names, arguments and results,
-- each forwarding a call to the partition of its key (hashtext(key), PL/Proxy's power-of-two mapping), so an
-- application moves from one server to the router by changing its connection string only.
--
-- Why a file and not a function of the extension: the router is a database without rate_limit (its functions
-- would clash with the forwarding ones, and a router needs no preloaded library), so what sets it up must
-- live there. Re-running the file and create_router() replaces what they made: that is also how a router is
-- upgraded or given other partitions.
--
-- Safe to expose to every role, as the extension is (docs/security.md): every function here names every
-- object and operator with its schema, so no caller's search_path (look-alike operators, functions, types
-- or tables in a schema before pg_catalog or in pg_temp) can change what it does or where it routes a key;
-- the functions that only the owner runs, or that run only when a call failed, also fix their search_path.
-- None is SECURITY DEFINER: each call runs as its caller, on the router and on the partitions.

CREATE EXTENSION IF NOT EXISTS plproxy;
CREATE SCHEMA IF NOT EXISTS rate_limit;
CREATE SCHEMA IF NOT EXISTS rate_limit_router;
-- schemas made before by a role that is not a superuser would let it replace the router's functions
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace AS n
               JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
               WHERE n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY['rate_limit', 'rate_limit_router']::pg_catalog.name[])
                 AND NOT r.rolsuper) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'schema rate_limit or rate_limit_router belongs to a role that is not a superuser',
            HINT = 'Drop it (or give it to a superuser) before setting the router up: its owner could replace the router''s functions.';
    END IF;
END
$$;
COMMENT ON SCHEMA rate_limit_router IS 'rate_limit''s PL/Proxy router: its set-up and forwarding functions';
-- every role may call the router's functions, as on a partition; what is the owner's is revoked below
GRANT USAGE ON SCHEMA rate_limit, rate_limit_router TO PUBLIC;

DO $$
BEGIN
    CREATE TYPE rate_limit.decision AS (
        allowed boolean, remaining bigint, "limit" bigint, retry_after interval, reset_after interval,
        policy text, shadow_denied boolean, lease bigint);
EXCEPTION WHEN duplicate_object THEN
    -- a router set up for 0.3.0: the decision of 0.4.0 reports would-be denials of shadow mode, and the
    -- lease an acquire got
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute
                   WHERE attrelid OPERATOR(pg_catalog.=) 'rate_limit.decision'::pg_catalog.regclass
                     AND attname OPERATOR(pg_catalog.=) 'shadow_denied' AND NOT attisdropped) THEN
        ALTER TYPE rate_limit.decision ADD ATTRIBUTE shadow_denied boolean;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute
                   WHERE attrelid OPERATOR(pg_catalog.=) 'rate_limit.decision'::pg_catalog.regclass
                     AND attname OPERATOR(pg_catalog.=) 'lease' AND NOT attisdropped) THEN
        ALTER TYPE rate_limit.decision ADD ATTRIBUTE lease bigint;
    END IF;
END
$$;

-- The router's set-up: one row, written by create_router.
CREATE TABLE IF NOT EXISTS rate_limit_router.settings (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    cluster text NOT NULL,
    partitions integer NOT NULL,
    on_partition_down text NOT NULL CHECK (on_partition_down IN ('fail_closed', 'fail_open'))
);
-- how long a call may wait for its partitions (a router set up before 0.5.0 gets the default)
ALTER TABLE rate_limit_router.settings
    ADD COLUMN IF NOT EXISTS timeout interval NOT NULL DEFAULT interval '2 seconds'
        CHECK (timeout >= interval '1 millisecond' AND timeout <= interval '1 day');

-- The deadline of every forwarded call (src/cluster/router.rs says why it is PostgreSQL's lock timeout):
-- armed at the start of a call's block, it ends with that block (the subtransaction of its EXCEPTION
-- clause) or with the transaction, whichever way they end: no deadline outlives the call that armed it,
-- nor a COMMIT, a ROLLBACK or a DISCARD ALL. When it passes, the call fails with 55P03, which the wrapper
-- turns into a partition that did not answer. From the rate_limit library, which the router loads without
-- the extension (no preloading).
CREATE OR REPLACE FUNCTION rate_limit_router.arm_deadline(milliseconds integer) RETURNS void
LANGUAGE c VOLATILE AS 'rate_limit', 'router_arm_deadline_wrapper';
CREATE OR REPLACE FUNCTION rate_limit_router.disarm_deadline() RETURNS void
LANGUAGE c VOLATILE AS 'rate_limit', 'router_disarm_deadline_wrapper';
CREATE OR REPLACE FUNCTION rate_limit_router.deadline_passed() RETURNS boolean
LANGUAGE c VOLATILE AS 'rate_limit', 'router_deadline_passed_wrapper';

-- Calls a fail_open router allowed because their partition could not be reached (not transactional: a
-- rolled-back caller's allowed call stays counted). Every role counts in it (USAGE: nextval), as every
-- caller of a fail_open router must; no role but the owner may set it back (UPDATE).
CREATE SEQUENCE IF NOT EXISTS rate_limit_router.allowed_while_down;
REVOKE ALL ON SEQUENCE rate_limit_router.allowed_while_down FROM PUBLIC;
GRANT USAGE ON SEQUENCE rate_limit_router.allowed_while_down TO PUBLIC;

-- What a forwarded call that failed with `message` and `state` becomes, in the router's PL/pgSQL functions
-- (the calls sent to every partition, the merged views), as the forwarder decides it for the others
-- (src/cluster/router/forward.rs): returns only when the call is to be answered "allowed" (allow: a call
-- that takes, on a fail_open router), having counted it; raises the answer otherwise:
--   - the partition could not be reached: PL/Proxy could not open a connection to it (its message names
--     PQconnectStart, PQconnectPoll or a connect timeout, and carries no answer of the partition's), or the
--     router's deadline passed with no answer (55P03 once the deadline has passed): 08006, or allowed;
--   - the partition answered, late: its own lock timeout (the key's row is held by another transaction
--     there) or statement timeout, both shorter than the router's (create_router sets them): 55P03 or
--     57014, never allowed: a locked key is that key's problem, not the partition's;
--   - the partition refused the connection with an error of its own, or an open connection broke: 08006,
--     never allowed;
--   - any other error is raised again as it was (errors a partition raised keep their SQLSTATE).
DROP FUNCTION IF EXISTS rate_limit_router.deadline_passed();
CREATE OR REPLACE FUNCTION rate_limit_router.forwarding_failed(message text, state text, allow boolean)
RETURNS void LANGUAGE c VOLATILE AS 'rate_limit', 'router_forwarding_failed_wrapper';

-- What each forwarding function that sends its call to one partition is, for the forwarder in the
-- library (rate_limit_router.forward): written by create_router, read by the forwarder as this table's
-- owner, once per backend and function.
CREATE TABLE IF NOT EXISTS rate_limit_router.forwarded (
    name text PRIMARY KEY,
    timeout_ms integer NOT NULL CHECK (timeout_ms >= 1),
    allow boolean NOT NULL,              -- a call that takes, on a fail_open router
    policy_arg integer,                  -- the argument naming the policy of an allowed answer (1-based)
    policy_is_array boolean NOT NULL,    -- ... an array of policies, of which the first is named
    keys_arg integer,                    -- the keys that must live on one partition (take_many)
    partitions integer NOT NULL CHECK (partitions >= 1)
);
REVOKE ALL ON TABLE rate_limit_router.forwarded FROM PUBLIC;

-- What the forwarding functions of a router set up by an earlier 0.5.0 build call, until create_router makes
-- them again (and drops these): the same answers, as the caller, with nothing SECURITY DEFINER left.
DO $$
BEGIN
    IF pg_catalog.to_regprocedure('rate_limit_router.partition_down(text,text,boolean)') IS NOT NULL THEN
        CREATE OR REPLACE FUNCTION rate_limit_router.partition_down(message text, state text, allow boolean)
        RETURNS void LANGUAGE plpgsql SECURITY INVOKER SET search_path = pg_catalog, pg_temp
        AS 'BEGIN PERFORM rate_limit_router.forwarding_failed(message, state, allow); END';
    END IF;
END
$$;

-- take_many routes by its first key (the forwarder refuses keys of several partitions, 0A000).
CREATE OR REPLACE FUNCTION rate_limit_router.first_key_hash(keys text[]) RETURNS integer
LANGUAGE sql IMMUTABLE AS 'SELECT pg_catalog.hashtext(keys[1])';

-- The extension's calls, as the router forwards them (each function's entry in src/surface/ makes its row):
--   name, schema (where the router defines it), parameters (the extension's), the arguments passed on,
--   result, how it routes (a key expression, ALL or ANY), and what it is:
--     take   - takes tokens: fails open on a fail_open router (the forwarder answers "allowed");
--     read   - reads: always fails closed (an invented figure would mislead);
--     owner  - the extension owner's: fails closed, not executable by PUBLIC on the router either.
DROP FUNCTION IF EXISTS rate_limit_router.calls();
CREATE FUNCTION rate_limit_router.calls(
    OUT name text, OUT schema text, OUT parameters text, OUT arguments text, OUT result text,
    OUT route text, OUT kind text)
RETURNS SETOF record LANGUAGE sql IMMUTABLE AS $$
VALUES
  -- BEGIN made from src/surface/ by scripts/generate-surface.sh
  ('rate_limiting_request', 'public', 'id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60',
   'id, refill_per_sec, window_seconds', 'integer', 'pg_catalog.hashtext(id)', 'take'),
  ('peek_request', 'rate_limit', 'id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60',
   'id, refill_per_sec, window_seconds', 'bigint', 'pg_catalog.hashtext(id)', 'read'),
  ('tokens', 'rate_limit', 'id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60',
   'id, refill_per_sec, window_seconds', 'numeric', 'pg_catalog.hashtext(id)', 'read'),
  ('reset_request', 'rate_limit', 'id text',
   'id', 'boolean', 'pg_catalog.hashtext(id)', 'owner'),
  ('take', 'rate_limit', 'policy text, key text, cost integer DEFAULT 1',
   'policy, key, cost', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('allow', 'rate_limit', 'policy text, key text, cost integer DEFAULT 1',
   'policy, key, cost', 'boolean', 'pg_catalog.hashtext(key)', 'take'),
  ('take_many', 'rate_limit', 'policies text[], keys text[], cost integer DEFAULT 1',
   'policies, keys, cost', 'rate_limit.decision', 'rate_limit_router.first_key_hash(keys)', 'take'),
  ('take_ad_hoc', 'rate_limit', 'key text, rate bigint, per interval, burst bigint DEFAULT NULL::bigint, cost integer DEFAULT 1',
   'key, rate, per, burst, cost', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('peek', 'rate_limit', 'policy text, key text',
   'policy, key', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'read'),
  ('wait', 'rate_limit', 'policy text, key text, cost integer DEFAULT 1, timeout interval DEFAULT NULL::interval',
   'policy, key, cost, timeout', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('charge', 'rate_limit', 'policy text, key text, cost bigint',
   'policy, key, cost', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('acquire', 'rate_limit', 'policy text, key text',
   'policy, key', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('release', 'rate_limit', 'policy text, key text, lease bigint, outcome text DEFAULT ''ok''::text, latency interval DEFAULT NULL::interval',
   'policy, key, lease, outcome, latency', 'boolean', 'pg_catalog.hashtext(key)', 'read'),
  ('reserve', 'rate_limit', 'policy text, key text, estimate bigint DEFAULT NULL::bigint, hold interval DEFAULT ''00:05:00''::interval, amounts jsonb DEFAULT NULL::jsonb',
   'policy, key, estimate, hold, amounts', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('settle', 'rate_limit', 'policy text, key text, reservation bigint, actual bigint DEFAULT NULL::bigint, amounts jsonb DEFAULT NULL::jsonb',
   'policy, key, reservation, actual, amounts', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'read'),
  ('reserve_many', 'rate_limit', 'policies text[], key text, estimates bigint[] DEFAULT NULL::bigint[], hold interval DEFAULT ''00:05:00''::interval, amounts jsonb DEFAULT NULL::jsonb',
   'policies, key, estimates, hold, amounts', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('settle_many', 'rate_limit', 'policies text[], key text, reservation bigint, actuals bigint[] DEFAULT NULL::bigint[], amounts jsonb DEFAULT NULL::jsonb',
   'policies, key, reservation, actuals, amounts', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'read'),
  ('book', 'rate_limit', 'policy text, key text, cost bigint DEFAULT 1, max_delay interval DEFAULT ''1 day''::interval',
   'policy, key, cost, max_delay', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'take'),
  ('cancel_booking', 'rate_limit', 'policy text, key text, booking bigint',
   'policy, key, booking', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'read'),
  ('refund', 'rate_limit', 'policy text, key text, tokens bigint',
   'policy, key, tokens', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'owner'),
  ('reset', 'rate_limit', 'policy text, key text',
   'policy, key', 'boolean', 'pg_catalog.hashtext(key)', 'owner'),
  ('reset_ad_hoc', 'rate_limit', 'key text',
   'key', 'boolean', 'pg_catalog.hashtext(key)', 'owner'),
  ('block', 'rate_limit', 'policy text, key text, duration interval',
   'policy, key, duration', 'rate_limit.decision', 'pg_catalog.hashtext(key)', 'owner'),
  ('unblock', 'rate_limit', 'policy text, key text',
   'policy, key', 'boolean', 'pg_catalog.hashtext(key)', 'owner'),
  ('headers', 'rate_limit', 'decision rate_limit.decision, policy text DEFAULT NULL::text',
   'decision, policy', 'jsonb', 'ANY', 'read'),
  ('create_policy', 'rate_limit', 'name text, rate bigint, per interval, burst bigint DEFAULT NULL::bigint, algorithm text DEFAULT ''token_bucket''::text, store text DEFAULT NULL::text, shadow boolean DEFAULT false, max_debt bigint DEFAULT 0, time_zone text DEFAULT NULL::text, anchor timestamp without time zone DEFAULT NULL::timestamp without time zone, block_after bigint DEFAULT NULL::bigint, block_for interval DEFAULT NULL::interval, options jsonb DEFAULT NULL::jsonb',
   'name, rate, per, burst, algorithm, store, shadow, max_debt, time_zone, anchor, block_after, block_for, options', 'void', 'ALL', 'owner'),
  ('alter_policy', 'rate_limit', 'name text, rate bigint DEFAULT NULL::bigint, per interval DEFAULT NULL::interval, burst bigint DEFAULT NULL::bigint, algorithm text DEFAULT NULL::text, shadow boolean DEFAULT NULL::boolean, max_debt bigint DEFAULT NULL::bigint, time_zone text DEFAULT NULL::text, anchor timestamp without time zone DEFAULT NULL::timestamp without time zone, block_after bigint DEFAULT NULL::bigint, block_for interval DEFAULT NULL::interval, options jsonb DEFAULT NULL::jsonb',
   'name, rate, per, burst, algorithm, shadow, max_debt, time_zone, anchor, block_after, block_for, options', 'void', 'ALL', 'owner'),
  ('drop_policy', 'rate_limit', 'name text',
   'name', 'boolean', 'ALL', 'owner'),
  ('set_override', 'rate_limit', 'policy text, key text, rate bigint DEFAULT NULL::bigint, per interval DEFAULT NULL::interval, burst bigint DEFAULT NULL::bigint, action text DEFAULT ''limit''::text, until timestamp with time zone DEFAULT NULL::timestamp with time zone, note text DEFAULT NULL::text',
   'policy, key, rate, per, burst, action, until, note', 'void', 'ALL', 'owner'),
  ('clear_override', 'rate_limit', 'policy text, key text',
   'policy, key', 'boolean', 'ALL', 'owner'),
  ('purge', 'rate_limit', '',
   '', 'bigint', 'ALL', 'owner')
  -- END made from src/surface/
$$;

-- How the answers of every partition (RUN ON ALL) become one: NULL for calls routed to one partition.
CREATE OR REPLACE FUNCTION rate_limit_router.combined(name text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
SELECT CASE WHEN name OPERATOR(pg_catalog.=) ANY (ARRAY['create_policy', 'alter_policy', 'set_override'])
            THEN 'PERFORM %s; RETURN;'
            WHEN name OPERATOR(pg_catalog.=) ANY (ARRAY['drop_policy', 'clear_override'])
            THEN 'RETURN (SELECT pg_catalog.bool_or(r) FROM %s AS r);'
            WHEN name OPERATOR(pg_catalog.=) 'purge'
            THEN 'RETURN (SELECT pg_catalog.sum(r)::bigint FROM %s AS r);'
       END
$$;
-- only create_router reads the calls and how they combine
REVOKE ALL ON FUNCTION rate_limit_router.combined(text), rate_limit_router.calls() FROM PUBLIC;

-- Drops every function called schema.name, whatever its arguments: a router set up for an older version has
-- the older signatures (create_policy of 0.3.0 took six arguments), which would forward to partitions that
-- no longer have them and, beside the new ones, make calls by position ambiguous.
CREATE OR REPLACE FUNCTION rate_limit_router.drop_every_overload(schema text, name text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) schema::pg_catalog.regnamespace
               AND p.proname OPERATOR(pg_catalog.=) name LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f);
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION rate_limit_router.drop_every_overload(text, text) FROM PUBLIC;

-- A partition's connection string as the router's cluster uses it: the caller's, with the settings every
-- forwarded call runs under on the partition. Its own timeouts, shorter than the router's, so that a
-- partition that is up answers before the router gives up: a call waiting for a row another transaction
-- holds ends at half the router's timeout (lock_timeout: the key is busy), any call at three quarters
-- (statement_timeout), each with nothing taken; and pg_catalog alone on its search_path. Connection
-- options given by the client outrank every role's and database's own settings, so no role can lift them
-- for its calls. 22023 for a connection string that sets options itself (they would be replaced).
CREATE OR REPLACE FUNCTION rate_limit_router.partition_connection(partition text, timeout_ms integer)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF partition OPERATOR(pg_catalog.~*) '(^|[[:space:]?&])options[[:space:]]*=' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'create_router: a partition''s connection string sets options',
            DETAIL = 'The router sets the options of its connections: the timeouts a partition gives its calls.',
            HINT = 'Remove options from the connection string; set what it held for the role or database on the partition.';
    END IF;
    RETURN partition OPERATOR(pg_catalog.||) pg_catalog.format(
        ' options=''-c statement_timeout=%s -c lock_timeout=%s -c search_path=pg_catalog,pg_temp''',
        GREATEST(1, timeout_ms OPERATOR(pg_catalog.*) 3 OPERATOR(pg_catalog./) 4),
        GREATEST(1, timeout_ms OPERATOR(pg_catalog./) 2));
END
$$;

-- Sets the router up, or replaces its set-up: the PL/Proxy cluster `cluster` (a SQL/MED server with one
-- connection string per partition, a power of two of them, and a user mapping for PUBLIC: each caller
-- reaches the partitions as itself, so they check its rights), and the forwarding functions. on_partition_down
-- is 'fail_closed' (a call whose partition cannot be reached raises 08006) or 'fail_open' (calls that take
-- tokens are then allowed and counted in rate_limit_router.allowed_while_down; reads and the owner's calls
-- still fail closed, and so does every call whose partition answered, late or with an error). timeout bounds
-- every call: a partition that has not answered by then did not answer, whether it never accepted the
-- connection or stopped answering on one (a frozen server); the partitions give calls up sooner themselves
-- (partition_connection).
DROP FUNCTION IF EXISTS rate_limit_router.create_router(text, text[], text);
CREATE OR REPLACE FUNCTION rate_limit_router.create_router(
    cluster text, partitions text[], on_partition_down text DEFAULT 'fail_closed',
    timeout interval DEFAULT interval '2 seconds')
RETURNS TABLE (object text, action text) LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer := coalesce(cardinality(partitions), 0);
    ms integer;
    c record;
    options text;
    remote_result text;
    body text;
BEGIN
    IF cluster IS NULL OR partitions IS NULL OR on_partition_down IS NULL OR timeout IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'create_router: NULL argument',
            HINT = 'Name the cluster, list the partitions'' connection strings, choose fail_closed or fail_open and a timeout.';
    END IF;
    IF timeout < interval '1 millisecond' OR timeout > interval '1 day' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('create_router: timeout is %s', timeout),
            HINT = 'Give how long a call may wait for its partitions, from 1 millisecond to 1 day, e.g. interval ''2 seconds''.';
    END IF;
    ms := ceil(extract(epoch FROM timeout) * 1000)::integer;
    IF n < 1 OR n & (n - 1) <> 0 OR array_position(partitions, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('create_router: %s partitions; PL/Proxy needs a power of two (1, 2, 4, …)', n),
            HINT = 'Give one connection string per partition, 1, 2, 4, 8 … of them.';
    END IF;
    IF on_partition_down NOT IN ('fail_closed', 'fail_open') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('create_router: on_partition_down is %L',
                             CASE WHEN length(on_partition_down) > 64
                                  THEN left(on_partition_down, 64) || format('… (%s bytes)', octet_length(on_partition_down))
                                  ELSE on_partition_down END),
            HINT = 'Use fail_closed (08006 while a partition is down) or fail_open (allowed, counted).';
    END IF;

    SELECT string_agg(format('p%s %L', i - 1, rate_limit_router.partition_connection(partitions[i], ms)), ', '
                      ORDER BY i) INTO options
    FROM generate_subscripts(partitions, 1) AS i;
    EXECUTE format('DROP SERVER IF EXISTS %I CASCADE', cluster);
    EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER plproxy OPTIONS (connection_lifetime %L, %s)',
                   cluster, '1800', options);
    EXECUTE format('CREATE USER MAPPING FOR PUBLIC SERVER %I', cluster);
    EXECUTE format('GRANT USAGE ON FOREIGN SERVER %I TO PUBLIC', cluster);
    object := cluster; action := format('PL/Proxy cluster of %s partitions', n); RETURN NEXT;

    DELETE FROM rate_limit_router.settings;
    DELETE FROM rate_limit_router.forwarded;
    INSERT INTO rate_limit_router.settings (one, cluster, partitions, on_partition_down, timeout)
    VALUES (true, cluster, n, on_partition_down, timeout);

    FOR c IN SELECT * FROM rate_limit_router.calls() LOOP
        -- the PL/Proxy function: runs the extension's call on the key's partition (or on all, or any)
        remote_result := CASE WHEN c.route = 'ALL' AND c.result = 'void' THEN 'SETOF integer'
                              WHEN c.route = 'ALL' THEN 'SETOF ' || c.result
                              ELSE c.result END;
        -- every earlier signature goes too: a router set up for an older version keeps no stale overload
        PERFORM rate_limit_router.drop_every_overload('rate_limit_router', c.name || '_remote');
        EXECUTE format(
            'CREATE FUNCTION rate_limit_router.%I(%s) RETURNS %s LANGUAGE plproxy AS %L',
            c.name || '_remote', regexp_replace(c.parameters, ' DEFAULT [^,]*', '', 'g'), remote_result,
            format('CLUSTER %L; RUN ON %s; ', cluster, c.route)
              || CASE WHEN c.result = 'void'
                      THEN format('SELECT 1 FROM %I.%I(%s);', c.schema, c.name, c.arguments)
                      ELSE format('TARGET %I.%I;', c.schema, c.name) END);
        -- callers run it as themselves (the partition checks their rights): closed only where the call is
        IF c.kind = 'owner' THEN
            EXECUTE format('REVOKE ALL ON FUNCTION rate_limit_router.%I FROM PUBLIC', c.name || '_remote');
        END IF;

        -- the function callers see: the extension's name, parameters and result. A call sent to one
        -- partition goes through the library's forwarder (no PL/pgSQL, no subtransaction unless the router
        -- may answer it "allowed"); a call sent to every partition, an owner's, through PL/pgSQL, whose
        -- block arms the deadline, which ends with the block (a subtransaction)
        PERFORM rate_limit_router.drop_every_overload(c.schema, c.name);
        IF c.route = 'ALL' THEN
            body := format(rate_limit_router.combined(c.name),
                           format('rate_limit_router.%I(%s)', c.name || '_remote', c.arguments));
            EXECUTE format(
                'CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                c.schema, c.name, c.parameters, c.result,
                format('BEGIN PERFORM rate_limit_router.arm_deadline(%s); %s '
                       'EXCEPTION WHEN internal_error OR lock_not_available OR query_canceled THEN '
                       'PERFORM rate_limit_router.forwarding_failed(SQLERRM, SQLSTATE, false); RETURN %s; END',
                       ms, body, CASE WHEN c.result = 'void' THEN '' ELSE 'NULL' END));
        ELSE
            EXECUTE format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE c VOLATILE AS %L, %L',
                           c.schema, c.name, c.parameters, c.result, 'rate_limit', 'router_forward');
            INSERT INTO rate_limit_router.forwarded
                (name, timeout_ms, allow, policy_arg, policy_is_array, keys_arg, partitions)
            SELECT c.name, ms, c.kind = 'take' AND on_partition_down = 'fail_open',
                   coalesce(array_position(a, 'policy'), array_position(a, 'policies')),
                   array_position(a, 'policies') IS NOT NULL,
                   CASE WHEN c.route LIKE 'rate_limit_router.first_key_hash(%' THEN array_position(a, 'keys') END,
                   n
            FROM (SELECT regexp_split_to_array(c.arguments, ', ') AS a) AS args
            ON CONFLICT (name) DO UPDATE SET timeout_ms = EXCLUDED.timeout_ms, allow = EXCLUDED.allow,
                policy_arg = EXCLUDED.policy_arg, policy_is_array = EXCLUDED.policy_is_array,
                keys_arg = EXCLUDED.keys_arg, partitions = EXCLUDED.partitions;
        END IF;
        IF c.kind = 'owner' THEN
            EXECUTE format('REVOKE ALL ON FUNCTION %I.%I(%s) FROM PUBLIC', c.schema, c.name,
                           regexp_replace(c.parameters, ' DEFAULT [^,]*', '', 'g'));
        END IF;
        object := format('%I.%I', c.schema, c.name);
        action := CASE c.route WHEN 'ALL' THEN 'sent to every partition' WHEN 'ANY' THEN 'sent to any partition'
                  ELSE 'routed by ' || c.route END;
        RETURN NEXT;
    END LOOP;

    -- statistics and buckets: every partition's, merged. A key lives on one partition, so its counts are
    -- all in that partition's summary: the merged top keys keep the partitions' bounds as they are.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION rate_limit_router.stats_remote(
            OUT kind text, OUT policy text, OUT calls bigint, OUT granted bigint, OUT denied bigint,
            OUT tokens_granted bigint, OUT last_denial timestamptz, OUT since timestamptz)
        RETURNS SETOF record LANGUAGE plproxy AS %L$f$,
        format('CLUSTER %L; RUN ON ALL; SELECT kind, policy, calls, granted, denied, tokens_granted, '
               'last_denial, since FROM rate_limit.stats;', cluster));
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION rate_limit_router.top_limited_remote(
            OUT kind text, OUT policy text, OUT key text, OUT denials bigint, OUT denials_min bigint)
        RETURNS SETOF record LANGUAGE plproxy AS %L$f$,
        format('CLUSTER %L; RUN ON ALL; SELECT kind, policy, key, denials, denials_min '
               'FROM rate_limit.top_limited;', cluster));
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION rate_limit_router.buckets_remote(
            OUT kind text, OUT policy text, OUT key text, OUT tokens numeric, OUT "limit" bigint,
            OUT rate bigint, OUT per interval, OUT algorithm text, OUT updated_at timestamptz, OUT store text)
        RETURNS SETOF record LANGUAGE plproxy AS %L$f$,
        format('CLUSTER %L; RUN ON ALL; SELECT kind, policy, key, tokens, "limit", rate, per, algorithm, '
               'updated_at, store FROM rate_limit.buckets;', cluster));
    REVOKE ALL ON FUNCTION rate_limit_router.stats_remote(), rate_limit_router.top_limited_remote(),
        rate_limit_router.buckets_remote() FROM PUBLIC;
    object := 'rate_limit.stats, rate_limit.top_limited, rate_limit.buckets';
    action := 'merged from every partition';
    RETURN NEXT;
    -- what forwarding functions made by an earlier 0.5.0 build called
    DROP FUNCTION IF EXISTS rate_limit_router.partition_down(text, text, boolean);
    DROP FUNCTION IF EXISTS rate_limit_router.disarmed(anyelement);
END
$$;
REVOKE ALL ON FUNCTION rate_limit_router.create_router(text, text[], text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limit_router.partition_connection(text, integer) FROM PUBLIC;

-- Placeholders until create_router replaces them (the views need them to exist).
DO $$
BEGIN
    CREATE FUNCTION rate_limit_router.stats_remote(
        OUT kind text, OUT policy text, OUT calls bigint, OUT granted bigint, OUT denied bigint,
        OUT tokens_granted bigint, OUT last_denial timestamptz, OUT since timestamptz)
    RETURNS SETOF record LANGUAGE sql AS 'SELECT NULL::text, NULL, 0::bigint, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz, NULL::timestamptz WHERE false';
    CREATE FUNCTION rate_limit_router.top_limited_remote(
        OUT kind text, OUT policy text, OUT key text, OUT denials bigint, OUT denials_min bigint)
    RETURNS SETOF record LANGUAGE sql AS 'SELECT NULL::text, NULL, NULL, 0::bigint, 0::bigint WHERE false';
    CREATE FUNCTION rate_limit_router.buckets_remote(
        OUT kind text, OUT policy text, OUT key text, OUT tokens numeric, OUT "limit" bigint,
        OUT rate bigint, OUT per interval, OUT algorithm text, OUT updated_at timestamptz, OUT store text)
    RETURNS SETOF record LANGUAGE sql
    AS 'SELECT NULL::text, NULL, NULL, 0::numeric, 0::bigint, 0::bigint, NULL::interval, NULL, NULL::timestamptz, NULL WHERE false';
EXCEPTION WHEN duplicate_function THEN NULL;
END
$$;

-- The merged views read every partition; one that is down makes them fail with 08006.
CREATE OR REPLACE FUNCTION rate_limit_router.every_partition(what text) RETURNS SETOF json
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limit_router.arm_deadline(coalesce(
        (SELECT ceil(extract(epoch FROM s.timeout) * 1000)::integer FROM rate_limit_router.settings AS s), 2000));
    RETURN QUERY EXECUTE format('SELECT pg_catalog.row_to_json(r) FROM rate_limit_router.%I() AS r', what || '_remote');
EXCEPTION
    WHEN internal_error OR lock_not_available OR query_canceled THEN
        PERFORM rate_limit_router.forwarding_failed(SQLERRM, SQLSTATE, false);
END
$$;
REVOKE ALL ON FUNCTION rate_limit_router.every_partition(text) FROM PUBLIC;

CREATE OR REPLACE VIEW rate_limit.stats AS
SELECT s.kind, s.policy, sum(s.calls)::bigint AS calls, sum(s.granted)::bigint AS granted,
       sum(s.denied)::bigint AS denied, sum(s.tokens_granted)::bigint AS tokens_granted,
       max(s.last_denial) AS last_denial, min(s.since) AS since
FROM rate_limit_router.every_partition('stats') AS r,
     json_to_record(r) AS s(kind text, policy text, calls bigint, granted bigint, denied bigint,
                            tokens_granted bigint, last_denial timestamptz, since timestamptz)
GROUP BY s.kind, s.policy;

CREATE OR REPLACE VIEW rate_limit.top_limited AS
SELECT t.kind, t.policy,
       (row_number() OVER (PARTITION BY t.kind, t.policy ORDER BY t.denials DESC, t.denials_min DESC, t.key))::integer
         AS rank,
       t.key, t.denials, t.denials_min
FROM rate_limit_router.every_partition('top_limited') AS r,
     json_to_record(r) AS t(kind text, policy text, key text, denials bigint, denials_min bigint);

CREATE OR REPLACE VIEW rate_limit.buckets AS
SELECT b.*
FROM rate_limit_router.every_partition('buckets') AS r,
     json_to_record(r) AS b(kind text, policy text, key text, tokens numeric, "limit" bigint, rate bigint,
                            per interval, algorithm text, updated_at timestamptz, store text);

REVOKE ALL ON rate_limit.stats, rate_limit.top_limited, rate_limit.buckets FROM PUBLIC;

-- What the router allowed while a partition was down (fail_open), and how it is set up.
CREATE OR REPLACE VIEW rate_limit_router.status AS
SELECT s.cluster, s.partitions, s.on_partition_down,
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rate_limit_router.allowed_while_down)
         AS allowed_while_down,
       s.timeout
FROM rate_limit_router.settings AS s;
