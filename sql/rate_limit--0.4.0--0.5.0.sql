-- rate_limit 0.4.0 -> 0.5.0. Assembled by scripts/assemble-upgrade.sh from sql/unreleased/*.sql,
-- one fragment per change: edit those, then assemble again. Frozen once 0.5.0 is in sql/RELEASED.
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.5.0'" to load this file. \quit

-- Functions whose arguments changed in 0.5.0, dropped before 000-new-functions.sql creates them again:
-- rate_limit.release takes how the call went (outcome, latency) for adaptive concurrency policies.
DROP FUNCTION rate_limit.release(text, text, bigint);

-- The functions new in 0.5.0, made from src/surface/ by scripts/generate-surface.sh (do not
-- edit): each as pgrx's schema creates it. Their privileges and comments end the upgrade script.
CREATE FUNCTION rate_limit.allow(policy text, key text, cost integer DEFAULT 1) RETURNS boolean
    VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'allow_wrapper';
CREATE FUNCTION rate_limit.take_batch(policy text, keys text[], costs integer[] DEFAULT NULL::integer[], all_or_nothing boolean DEFAULT false) RETURNS TABLE(ordinality integer, key text, allowed boolean, remaining bigint, retry_after interval)
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'take_batch_wrapper';
CREATE FUNCTION rate_limit.release(policy text, key text, lease bigint, outcome text DEFAULT 'ok'::text, latency interval DEFAULT NULL::interval) RETURNS boolean
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'release_wrapper';
CREATE FUNCTION rate_limit.reserve(policy text, key text, estimate bigint DEFAULT NULL::bigint, hold interval DEFAULT '00:05:00'::interval, amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'reserve_wrapper';
CREATE FUNCTION rate_limit.settle(policy text, key text, reservation bigint, actual bigint DEFAULT NULL::bigint, amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'settle_wrapper';
CREATE FUNCTION rate_limit.reserve_many(policies text[], key text, estimates bigint[] DEFAULT NULL::bigint[], hold interval DEFAULT '00:05:00'::interval, amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'reserve_many_wrapper';
CREATE FUNCTION rate_limit.settle_many(policies text[], key text, reservation bigint, actuals bigint[] DEFAULT NULL::bigint[], amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'settle_many_wrapper';
CREATE FUNCTION rate_limit.book(policy text, key text, cost bigint DEFAULT 1, max_delay interval DEFAULT '1 day'::interval) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'book_wrapper';
CREATE FUNCTION rate_limit.cancel_booking(policy text, key text, booking bigint) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cancel_booking_wrapper';
CREATE FUNCTION rate_limit.set_override(policy text, key text, rate bigint DEFAULT NULL::bigint, per interval DEFAULT NULL::interval, burst bigint DEFAULT NULL::bigint, action text DEFAULT 'limit'::text, until timestamp with time zone DEFAULT NULL::timestamp with time zone, note text DEFAULT NULL::text) RETURNS void
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'set_override_wrapper';
CREATE FUNCTION rate_limit.clear_override(policy text, key text) RETURNS boolean
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'clear_override_wrapper';
CREATE FUNCTION rate_limit.nodes_of(keys text[]) RETURNS TABLE(key text, host text, port integer, shard bigint)
    STABLE SECURITY DEFINER PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'nodes_of_wrapper';
CREATE FUNCTION rate_limit.metrics_rows() RETURNS TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, shadow_denied bigint, blocked bigint, tokens_granted bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'metrics_rows_wrapper';
CREATE FUNCTION rate_limit.node_metrics_rows() RETURNS TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, shadow_denied bigint, blocked bigint, tokens_granted bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'node_metrics_rows_wrapper';
CREATE FUNCTION rate_limit.purge_rows() RETURNS TABLE(store text, finished_at timestamp with time zone, freed bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'purge_rows_wrapper';
CREATE FUNCTION rate_limit.purge_span(idle interval, after_namespace text, after_key text) RETURNS TABLE(deleted bigint, next_namespace text, next_key text)
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'purge_span_wrapper';
CREATE FUNCTION rate_limit.metrics_top_keys_rows() RETURNS TABLE(kind text, policy text, rank integer, key text, denials bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'metrics_top_keys_rows_wrapper';

-- Adaptive concurrency (create_policy / alter_policy options latency_target and adaptive_min): a
-- concurrency policy with a latency target adapts each key's limit between adaptive_min and its rate.
-- Before 003-metrics.sql, whose rate_limit.adaptive_limits_rows reads the new columns.
ALTER TABLE rate_limit.policies
    ADD COLUMN adaptive_min bigint CHECK (adaptive_min >= 1),
    ADD COLUMN latency_target interval CHECK (latency_target > interval '0');

-- Monitoring for Prometheus (#30): the metrics views and pg_monitor's grants on them, and leases_held_rows
-- (SQL); the library's functions are in 000-new-functions.sql, their privileges at the end of the script.
-- Monitoring (docs/operations.md#monitoring, monitoring/ for Prometheus through postgres_exporter): read by
-- the owner and by members of pg_monitor, the role a monitoring agent runs as. Counters (since the
-- statistics' "since", kept across clean restarts) per policy of this database; denied counts the calls
-- refused, shadow_denied the ones shadow mode let through that would have been; blocked counts those of
-- either that a block decided.
CREATE VIEW rate_limit.metrics AS
SELECT pg_catalog.current_database()::text AS database, m.kind, m.policy, m.calls, m.granted, m.denied,
       m.shadow_denied, m.blocked, m.tokens_granted
FROM rate_limit.metrics_rows() AS m;
COMMENT ON VIEW rate_limit.metrics IS
    'Counters per policy for monitoring: calls, granted, denied, would-be denials of shadow mode, blocked, tokens granted; owner and pg_monitor';

-- Held leases of each concurrency policy, counted as the owner (pg_monitor reads the counts, never the
-- keys): each lease slot is a bucket with 0 tokens while held, 1 when free. The table store's slots are
-- read by primary key; the memory store is scanned once, only if a concurrency policy may use it. Parsed
-- at each call with the caller's search_path, as SECURITY DEFINER: every type and operator is qualified.
CREATE FUNCTION rate_limit.leases_held_rows() RETURNS TABLE (policy text, held bigint)
LANGUAGE sql STABLE SECURITY DEFINER PARALLEL UNSAFE AS $$
WITH leases AS MATERIALIZED (
    SELECT p.name, p.rate, p.store FROM rate_limit.policies AS p
    WHERE p.algorithm OPERATOR(pg_catalog.=) 'concurrency'),
-- one scan of the memory store, and only when a concurrency policy may keep its leases there
in_memory AS MATERIALIZED (
    SELECT m.policy, pg_catalog.count(*) AS held FROM rate_limit.memory_buckets() AS m
    WHERE EXISTS (SELECT FROM leases AS l
                  WHERE COALESCE(l.store OPERATOR(pg_catalog.<>) 'table', true))
      AND m.algorithm OPERATOR(pg_catalog.=) 'concurrency' AND m.tokens OPERATOR(pg_catalog.<) 1
    GROUP BY m.policy)
SELECT l.name::pg_catalog.text,
       -- the table store: the policy's slot rows by primary key (namespace name U+001F slot)
       (SELECT pg_catalog.count(*) FROM rate_limit.bucket_state AS s
        WHERE s.namespace OPERATOR(pg_catalog.=) ANY (ARRAY(
                SELECT l.name OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) g::pg_catalog.text
                FROM pg_catalog.generate_series(0, l.rate OPERATOR(pg_catalog.-) 1) AS g))
          AND rate_limit.state_tokens(s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst,
                pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) rate_limit.clock_shift())
              OPERATOR(pg_catalog.<) 1)
       OPERATOR(pg_catalog.+) COALESCE(i.held, 0)
FROM leases AS l
LEFT JOIN in_memory AS i ON i.policy OPERATOR(pg_catalog.=) l.name
$$;

-- Each adaptive concurrency policy's keys under a cut limit, read as the owner (pg_monitor reads the
-- aggregates, never the keys): how many, the lowest limit in force and their mean, in leases (the
-- policy's most when no key is cut). A key's limit is one bucket beside its slots (namespace name U+001F
-- "adaptive limit"): the table store's are read by primary key, the memory store is scanned once, only if
-- an adaptive policy may use it. A limit past its forgetting (one lease TTL after its last cut) is full.
CREATE FUNCTION rate_limit.adaptive_limits_rows()
RETURNS TABLE (policy text, limited_keys bigint, lowest_limit float8, mean_limit float8)
LANGUAGE sql STABLE SECURITY DEFINER PARALLEL UNSAFE AS $$
WITH adaptive AS MATERIALIZED (
    SELECT p.name, p.rate, p.store FROM rate_limit.policies AS p
    WHERE p.latency_target IS NOT NULL),
in_memory AS MATERIALIZED (
    SELECT m.policy, m.tokens FROM rate_limit.memory_buckets() AS m
    WHERE EXISTS (SELECT FROM adaptive AS a
                  WHERE COALESCE(a.store OPERATOR(pg_catalog.<>) 'table', true))
      AND m.algorithm OPERATOR(pg_catalog.=) 'adaptive_limit'),
limits AS (
    SELECT a.name, t.tokens
    FROM adaptive AS a,
    LATERAL (SELECT rate_limit.state_tokens(s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst,
                        pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) rate_limit.clock_shift()) AS tokens
             FROM rate_limit.bucket_state AS s
             WHERE s.namespace OPERATOR(pg_catalog.=)
                   (a.name OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) 'adaptive limit')
             UNION ALL
             SELECT i.tokens FROM in_memory AS i WHERE i.policy OPERATOR(pg_catalog.=) a.name) AS t
    WHERE t.tokens OPERATOR(pg_catalog.<) a.rate)
SELECT a.name::pg_catalog.text, pg_catalog.count(l.tokens),
       COALESCE(pg_catalog.min(l.tokens), a.rate)::pg_catalog.float8,
       COALESCE(pg_catalog.avg(l.tokens), a.rate)::pg_catalog.float8
FROM adaptive AS a
LEFT JOIN limits AS l ON l.name OPERATOR(pg_catalog.=) a.name
GROUP BY a.name, a.rate
$$;

-- Each policy's numbers as gauges: rate tokens per period_seconds, at most burst at once (a window's limit;
-- a concurrency policy's leases), and for a concurrency policy the leases held now.
CREATE VIEW rate_limit.metrics_policies AS
SELECT pg_catalog.current_database()::text AS database, p.name AS policy, p.algorithm, p.rate,
       pg_catalog.date_part('epoch', p.per) AS period_seconds, p.burst, p.shadow, l.held AS leases_held,
       a.limited_keys AS adaptive_limited_keys, a.lowest_limit AS adaptive_lowest_limit,
       a.mean_limit AS adaptive_mean_limit
FROM rate_limit.policies AS p
LEFT JOIN rate_limit.leases_held_rows() AS l ON l.policy COLLATE "C" = p.name
LEFT JOIN rate_limit.adaptive_limits_rows() AS a ON a.policy COLLATE "C" = p.name;
COMMENT ON VIEW rate_limit.metrics_policies IS
    'Each policy''s rate, period, burst and shadow mode, the leases held of a concurrency policy, and an adaptive one''s keys under a cut limit; owner and pg_monitor';

-- The memory store against this database's share (rate_limit.database_share), with the server's evictions.
CREATE VIEW rate_limit.metrics_memory AS
SELECT pg_catalog.current_database()::text AS database, u.database_buckets AS buckets, u.share_buckets,
       u.max_buckets, u.bytes_per_bucket, u.database_buckets * u.bytes_per_bucket AS bytes,
       u.share_buckets * u.bytes_per_bucket AS share_bytes, u.lossless_evictions, u.lossy_evictions,
       u.refused_full
FROM rate_limit.memory_usage() AS u;
COMMENT ON VIEW rate_limit.metrics_memory IS
    'This database''s memory-store buckets and bytes against its share, and the store''s evictions; owner and pg_monitor';

-- The background worker's last finished purge of this database's table store and of the memory store.
CREATE VIEW rate_limit.metrics_purge AS
SELECT pg_catalog.current_database()::text AS database, p.store, p.finished_at, p.freed
FROM rate_limit.purge_rows() AS p;
COMMENT ON VIEW rate_limit.metrics_purge IS
    'When the background worker last finished purging each store and what it freed (since the server started); owner and pg_monitor';

-- The most denied keys, at most rate_limit.metrics_top_keys per policy (0, none, by default).
CREATE VIEW rate_limit.metrics_top_keys AS
SELECT pg_catalog.current_database()::text AS database, t.kind, t.policy, t.rank, t.key, t.denials
FROM rate_limit.metrics_top_keys_rows() AS t;
COMMENT ON VIEW rate_limit.metrics_top_keys IS
    'The most denied keys per policy, up to rate_limit.metrics_top_keys of them (none by default); owner and pg_monitor';

-- the monitoring views: the owner and pg_monitor
REVOKE ALL ON TABLE rate_limit.metrics, rate_limit.metrics_policies, rate_limit.metrics_memory,
    rate_limit.metrics_purge, rate_limit.metrics_top_keys FROM PUBLIC;
GRANT SELECT ON TABLE rate_limit.metrics, rate_limit.metrics_policies, rate_limit.metrics_memory,
    rate_limit.metrics_purge, rate_limit.metrics_top_keys TO pg_monitor;

-- Per-key overrides (#30, read per key since #40): the table, the view (set_override and clear_override are
-- in 000-new-functions.sql), and the trigger that tells every backend of a change.
-- Per-key overrides of a policy (rate_limit.set_override, clear_override; listed by rate_limit.overrides):
-- one key's own rate, period or burst (those missing are the policy's), or a fixed answer, until expires_at
-- or for ever. Read per key by the calls of a key, by the primary key; its statement trigger
-- (finalize.sql) tells every backend that the overrides changed. drop_policy deletes a policy's
-- overrides; one set before its policy was created (left by a DELETE or TRUNCATE of rate_limit.policies,
-- a dropped namesake's) is never read nor listed. No foreign key: TRUNCATE rate_limit.policies keeps
-- working. Owner only; dumped.
CREATE TABLE rate_limit.key_overrides (
    policy     text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    action     text        NOT NULL CHECK (action IN ('limit', 'deny', 'exempt')),
    rate       bigint      CHECK (rate >= 1),
    per        interval    CHECK (per > interval '0'),
    burst      bigint      CHECK (burst >= 1),
    expires_at timestamptz,           -- NULL: no end
    set_at     timestamptz NOT NULL,  -- when its numbers took effect (the table store's clock)
    note       text CHECK (pg_catalog.length(note) <= 1000),
    PRIMARY KEY (policy, key),
    CONSTRAINT key_overrides_numbers_check
        CHECK ((action = 'limit') = (rate IS NOT NULL OR per IS NOT NULL OR burst IS NOT NULL))
);
-- How a call finds its key's override: one bucket page of a hash index (a policy name holds no space, so
-- the pair is unambiguous), where the primary key's btree descends four levels of text comparisons.
CREATE INDEX key_overrides_lookup ON rate_limit.key_overrides
    USING hash (((policy OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) key) COLLATE "C"));
COMMENT ON TABLE rate_limit.key_overrides IS
    'rate_limit per-key overrides of a policy; change them with rate_limit.set_override and clear_override';
SELECT pg_catalog.pg_extension_config_dump('rate_limit.key_overrides', '');

-- A change of the overrides invalidates, in every backend, what it keeps of them: whether each policy it
-- calls has any (overrides themselves are read per key, never kept).
CREATE TRIGGER key_overrides_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limit.key_overrides
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limit.policies_changed();
-- Every override written sets its key in the shared filter of keys that may have one, before it commits:
-- a call of a key the filter says has none reads nothing.
CREATE TRIGGER key_overrides_filter
    BEFORE INSERT OR UPDATE ON rate_limit.key_overrides
    FOR EACH ROW EXECUTE FUNCTION rate_limit.policies_changed();

-- Every per-key override, with whether it applies now (until expires_at). Owner only.
CREATE VIEW rate_limit.overrides AS
SELECT o.policy, o.key, o.action, o.rate, o.per, o.burst, o.expires_at,
       o.expires_at IS NULL OR o.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() AS active,
       o.set_at, o.note
FROM rate_limit.key_overrides AS o
JOIN rate_limit.policies AS p ON p.name OPERATOR(pg_catalog.=) o.policy
  AND o.set_at OPERATOR(pg_catalog.>=) p.created_at;
COMMENT ON VIEW rate_limit.overrides IS
    'Per-key overrides of the policies (rate_limit.set_override), with whether each applies now; owner only';

REVOKE ALL ON TABLE rate_limit.key_overrides FROM PUBLIC;
REVOKE ALL ON TABLE rate_limit.overrides FROM PUBLIC;

-- module_pathname without $libdir (#41): the library is found through dynamic_library_path, as
-- CloudNativePG's image volumes need (extension_control_path and dynamic_library_path name the image's
-- directories; $libdir is the server's own). Every C function an earlier version created with
-- '$libdir/rate_limit' is redefined with 'rate_limit' (CREATE OR REPLACE keeps its oid, privileges,
-- comment and membership); a server whose dynamic_library_path is the default, '$libdir', finds the same
-- file.
DO $$
DECLARE
    f oid;
BEGIN
    FOR f IN SELECT p.oid
               FROM pg_catalog.pg_proc AS p
               JOIN pg_catalog.pg_depend AS d
                 ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.objid OPERATOR(pg_catalog.=) p.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
               JOIN pg_catalog.pg_extension AS e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
              WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limit'
                AND p.probin OPERATOR(pg_catalog.=) '$libdir/rate_limit'
    LOOP
        EXECUTE pg_catalog.replace(pg_catalog.pg_get_functiondef(f), 'AS ''$libdir/rate_limit'', ',
                                   'AS ''rate_limit'', ');
    END LOOP;
END
$$;

-- rate_limit.purge_idle() (the purge for pg_cron, in short transactions): the procedure; its span function,
-- rate_limit.purge_span, is in 000-new-functions.sql.
-- The purge to schedule with pg_cron where no background worker runs (docs/operations.md): the full
-- buckets untouched for idle, read 1 000 rows of the state table a transaction in the primary key's order,
-- committing after each, so that a caller waits at most one short transaction for a row the purge locked
-- and a bucket in use keeps its row (rate_limit.purge_span does each span). CALL it on its own, as pg_cron
-- does: inside a transaction block its first COMMIT fails with 2D000. A procedure that commits can be
-- neither SECURITY DEFINER nor carry a SET clause: it runs as its caller (owner only) and names everything
-- with its schema.
CREATE PROCEDURE rate_limit.purge_idle(idle pg_catalog.interval DEFAULT pg_catalog.interval '5 minutes')
LANGUAGE plpgsql
AS $$
DECLARE
    span record;
    after_namespace pg_catalog.text;
    after_key pg_catalog.text;
BEGIN
    LOOP
        SELECT s.deleted, s.next_namespace, s.next_key INTO span
          FROM rate_limit.purge_span(idle, after_namespace, after_key) AS s;
        COMMIT;
        EXIT WHEN span.next_key IS NULL;
        after_namespace := span.next_namespace;
        after_key := span.next_key;
    END LOOP;
END
$$;

-- Weighted meters (create_policy / alter_policy option meters): what a unit of each named quantity costs
-- in tokens, for reserve's and settle's amounts.
ALTER TABLE rate_limit.policies
    ADD COLUMN meters jsonb CHECK (pg_catalog.jsonb_typeof(meters) = 'object');

-- Hierarchical quotas (create_policy / alter_policy option parent): a call on a child policy also takes
-- from its parent's bucket of the same key, all or nothing.
ALTER TABLE rate_limit.policies
    ADD COLUMN parent text CHECK (parent <> name);

-- Every function's privileges and comment, as sql/finalize.sql gives a fresh install:
-- BEGIN made from src/surface/ by scripts/generate-surface.sh: every function's privileges and comment
COMMENT ON FUNCTION rate_limiting_request(text, integer, integer) IS
    'Take one token from bucket id (refill_per_sec tokens/s, capacity refill_per_sec * window_seconds); returns the whole tokens left, or -1 when denied';
COMMENT ON FUNCTION rate_limit.peek_request(text, integer, integer) IS
    'Whole tokens in rate_limiting_request''s bucket id now under the given limit; consumes nothing';
COMMENT ON FUNCTION rate_limit.tokens(text, integer, integer) IS
    'Tokens in rate_limiting_request''s bucket id now under the given limit, exact to the millionth';
REVOKE EXECUTE ON FUNCTION rate_limit.reset_request(text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.reset_request(text) IS
    'Delete rate_limiting_request''s bucket id, making it full; true if it existed; owner only';
COMMENT ON FUNCTION rate_limit.take(text, text, integer) IS
    'Take cost tokens (0 only reports) from bucket key of a named policy; returns a rate_limit.decision';
COMMENT ON FUNCTION rate_limit.allow(text, text, integer) IS
    'Take cost tokens from bucket key of a named policy, as take does; true when allowed (a shadow policy''s would-be denial too)';
COMMENT ON FUNCTION rate_limit.take_many(text[], text[], integer) IS
    'Take cost tokens under every policy, all or nothing: keys holds one key for all, or one per policy';
COMMENT ON FUNCTION rate_limit.take_batch(text, text[], integer[], boolean) IS
    'Take costs[i] tokens (1 each by default) from bucket keys[i] of a policy for every key in order; one row per key';
COMMENT ON FUNCTION rate_limit.take_ad_hoc(text, bigint, interval, bigint, integer) IS
    'Take cost tokens from bucket key under an ad-hoc token bucket: rate per per, at most burst';
COMMENT ON FUNCTION rate_limit.peek(text, text) IS
    'The bucket of key under a policy, taking nothing';
COMMENT ON FUNCTION rate_limit.wait(text, text, integer, interval) IS
    'Sleep until cost tokens can be taken (or give up at timeout, taking nothing); returns the decision';
COMMENT ON FUNCTION rate_limit.charge(text, text, bigint) IS
    'Charge cost tokens to bucket key of a policy after the fact: always taken, down to its max_debt below zero';
COMMENT ON FUNCTION rate_limit.acquire(text, text) IS
    'Acquire a lease of key under a concurrency policy: the decision, with the lease id when allowed';
COMMENT ON FUNCTION rate_limit.release(text, text, bigint, text, interval) IS
    'Release a lease acquired with rate_limit.acquire: true if it was held and is now free; an adaptive policy''s limit follows the outcome and latency reported';
COMMENT ON FUNCTION rate_limit.reserve(text, text, bigint, interval, jsonb) IS
    'Reserve estimate tokens (or amounts of the policy''s meters) of key under a policy until settled or hold ends: the decision, with the reservation id in lease when allowed';
COMMENT ON FUNCTION rate_limit.settle(text, text, bigint, bigint, jsonb) IS
    'Settle a reservation on the tokens actually used (or amounts of the policy''s meters): gives back the rest or charges the excess, once; allowed when this call settled it';
COMMENT ON FUNCTION rate_limit.reserve_many(text[], text, bigint[], interval, jsonb) IS
    'Reserve estimates of key under several policies at once, all or nothing (or amounts each policy weighs with its own meters): the decision, with one reservation id in lease when allowed';
COMMENT ON FUNCTION rate_limit.settle_many(text[], text, bigint, bigint[], jsonb) IS
    'Settle a reservation of rate_limit.reserve_many under each of its policies on what the work used, once each; allowed when this call settled it under at least one';
COMMENT ON FUNCTION rate_limit.book(text, text, bigint, interval) IS
    'Book cost tokens of key under a token bucket policy, first come first served: when allowed, retry_after is when they exist and lease the booking id';
COMMENT ON FUNCTION rate_limit.cancel_booking(text, text, bigint) IS
    'Cancel a booking before its time; its tokens go back when nothing was booked after them; allowed when this call cancelled it';
REVOKE EXECUTE ON FUNCTION rate_limit.refund(text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.refund(text, text, bigint) IS
    'Put tokens back into bucket key of a policy, capped at its burst; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.reset(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.reset(text, text) IS
    'Delete bucket key of a policy, making it full; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.reset_ad_hoc(text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.reset_ad_hoc(text) IS
    'Delete the ad-hoc bucket key, making it full; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.block(text, text, interval) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.block(text, text, interval) IS
    'Block key under a policy for duration: its calls are denied without touching its bucket; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.unblock(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.unblock(text, text) IS
    'Lift the block of key under a policy and forget its penalty box count; true if it was blocked; owner only';
COMMENT ON FUNCTION rate_limit.headers(rate_limit.decision, text) IS
    'RateLimit, RateLimit-Policy and Retry-After HTTP field values for a decision, as jsonb';
REVOKE EXECUTE ON FUNCTION rate_limit.create_policy(text, bigint, interval, bigint, text, text, boolean, bigint, text, timestamp without time zone, bigint, interval, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.create_policy(text, bigint, interval, bigint, text, text, boolean, bigint, text, timestamp without time zone, bigint, interval, jsonb) IS
    'Create a named policy: rate tokens per per, at most burst; algorithm, store, shadow, max_debt, time_zone, anchor, block_after, block_for and options (jsonb, by name) optional; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.alter_policy(text, bigint, interval, bigint, text, boolean, bigint, text, timestamp without time zone, bigint, interval, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.alter_policy(text, bigint, interval, bigint, text, boolean, bigint, text, timestamp without time zone, bigint, interval, jsonb) IS
    'Change a policy (NULL keeps a value; in options, an option left out keeps its value and null clears it); buckets carry their tokens over, never gaining any; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.drop_policy(text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.drop_policy(text) IS
    'Drop a policy, its overrides and its table-store buckets; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.set_override(text, text, bigint, interval, bigint, text, timestamp with time zone, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.set_override(text, text, bigint, interval, bigint, text, timestamp with time zone, text) IS
    'Give one key of a policy its own rate, per or burst (action limit), or deny or exempt it, until a time or for ever; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.clear_override(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.clear_override(text, text) IS
    'Remove the override of a key: it follows its policy again; true if there was one; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.purge() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.purge() IS
    'Delete every bucket of both stores that is full now (lossless); returns how many; owner only';
REVOKE EXECUTE ON PROCEDURE rate_limit.purge_idle(interval) FROM PUBLIC;
COMMENT ON PROCEDURE rate_limit.purge_idle(interval) IS
    'Delete the full buckets untouched for idle, 1000 rows a transaction (CALL it on its own, as pg_cron does); owner only';
COMMENT ON FUNCTION rate_limit.clock_shift() IS
    'How far the table store''s clock is behind clock_timestamp() (non-zero after promoting a standby whose clock was off)';
COMMENT ON FUNCTION rate_limit.memory_usage() IS
    'Size and use of the memory store: buckets, slots, bytes per bucket, evictions, this database''s and this role''s shares';
REVOKE EXECUTE ON FUNCTION rate_limit.memory_shares() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.memory_shares() IS
    'Buckets each database holds in the memory store; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.reset_stats() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.reset_stats() IS
    'Zero every statistic and top limited key of this database; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.reset_stats(text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.reset_stats(text) IS
    'Zero the statistics and top limited keys of a policy in this database; owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.distribute(integer) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.distribute(integer) IS
    'On a Citus coordinator: policies as a reference table, state distributed by key, keyed calls delegated to the key''s node; idempotent; owner only';
COMMENT ON FUNCTION rate_limit.nodes_of(text[]) IS
    'Under Citus, the node (host, port) and shard that hold each key, in the order given: where to send its calls';
REVOKE EXECUTE ON FUNCTION rate_limit.node_stats_rows() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.node_stats_rows() IS
    'This node''s own rows of rate_limit.stats (on a Citus coordinator the view merges every node''s); owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.node_top_limited_rows() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.node_top_limited_rows() IS
    'This node''s own rows of rate_limit.top_limited (on a Citus coordinator the view merges every node''s); owner only';
REVOKE EXECUTE ON FUNCTION rate_limit.node_memory_buckets() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.node_memory_buckets() IS
    'This node''s own memory-store buckets (on a Citus coordinator rate_limit.buckets lists every node''s); owner only';
COMMENT ON FUNCTION rate_limit.limit_writes() IS
    'Row trigger: limit_writes(policy, key_column [, cost]) takes cost tokens per written row from the bucket of the row''s key; a denied row raises 53400 with the RateLimit header values in DETAIL';
REVOKE EXECUTE ON FUNCTION rate_limit.policies_changed() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.policies_changed() IS
    'Trigger: a change of rate_limit.policies or rate_limit.key_overrides is seen by every backend''s next transaction; a direct call is refused';
REVOKE EXECUTE ON FUNCTION rate_limit.policies_dropped() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.policies_dropped() IS
    'Trigger: records dropped policies in rate_limit.dropped_policies, for the memory store';
REVOKE EXECUTE ON FUNCTION rate_limit.memory_buckets() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.memory_buckets() IS
    'Internal: buckets of the memory store, for rate_limit.buckets';
REVOKE EXECUTE ON FUNCTION rate_limit.stats_rows() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.stats_rows() IS
    'Internal: the rows of rate_limit.stats';
REVOKE EXECUTE ON FUNCTION rate_limit.metrics_rows() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limit.metrics_rows() TO pg_monitor;
COMMENT ON FUNCTION rate_limit.metrics_rows() IS
    'Internal: the rows of rate_limit.metrics';
REVOKE EXECUTE ON FUNCTION rate_limit.node_metrics_rows() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limit.node_metrics_rows() TO pg_monitor;
COMMENT ON FUNCTION rate_limit.node_metrics_rows() IS
    'Internal: this node''s own rows of rate_limit.metrics (on a Citus coordinator the view sums every node''s)';
REVOKE EXECUTE ON FUNCTION rate_limit.leases_held_rows() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limit.leases_held_rows() TO pg_monitor;
COMMENT ON FUNCTION rate_limit.leases_held_rows() IS
    'Internal: the leases held of each concurrency policy, for rate_limit.metrics_policies';
REVOKE EXECUTE ON FUNCTION rate_limit.adaptive_limits_rows() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limit.adaptive_limits_rows() TO pg_monitor;
COMMENT ON FUNCTION rate_limit.adaptive_limits_rows() IS
    'Internal: each adaptive concurrency policy''s keys under a cut limit, for rate_limit.metrics_policies';
REVOKE EXECUTE ON FUNCTION rate_limit.purge_rows() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limit.purge_rows() TO pg_monitor;
COMMENT ON FUNCTION rate_limit.purge_rows() IS
    'Internal: the rows of rate_limit.metrics_purge';
REVOKE EXECUTE ON FUNCTION rate_limit.purge_span(interval, text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.purge_span(interval, text, text) IS
    'Internal: one transaction of rate_limit.purge_idle, the next 1000 rows after the one named';
REVOKE EXECUTE ON FUNCTION rate_limit.metrics_top_keys_rows() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limit.metrics_top_keys_rows() TO pg_monitor;
COMMENT ON FUNCTION rate_limit.metrics_top_keys_rows() IS
    'Internal: the rows of rate_limit.metrics_top_keys';
REVOKE EXECUTE ON FUNCTION rate_limit.top_limited_rows() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.top_limited_rows() IS
    'Internal: the rows of rate_limit.top_limited';
REVOKE EXECUTE ON FUNCTION rate_limit.state_after_take(bigint, timestamp with time zone, text, bigint, bigint, bigint, text, bigint, bigint, bigint, timestamp with time zone, timestamp with time zone, bigint, timestamp with time zone) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.state_after_take(bigint, timestamp with time zone, text, bigint, bigint, bigint, text, bigint, bigint, bigint, timestamp with time zone, timestamp with time zone, bigint, timestamp with time zone) IS
    'Internal: the level of a stored row after a take, or -1 if short (the table store''s UPDATE)';
REVOKE EXECUTE ON FUNCTION rate_limit.state_tokens(bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.state_tokens(bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone) IS
    'Internal: tokens of a stored row at a given time, exact to the millionth';
REVOKE EXECUTE ON FUNCTION rate_limit.state_is_full(bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.state_is_full(bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone) IS
    'Internal: whether a stored row is full at a given time';
-- END made from src/surface/
