-- rate_limit 0.4.0 -> 0.5.0. Assembled by scripts/assemble-upgrade.sh from sql/unreleased/*.sql,
-- one fragment per change: edit those, then assemble again. Frozen once 0.5.0 is in sql/RELEASED.
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.5.0'" to load this file. \quit

-- rate_limit.nodes_of(keys): under Citus, the node that holds each key (#31).
CREATE FUNCTION rate_limit."nodes_of"(
	"keys" TEXT[]
) RETURNS TABLE (
	"key" TEXT,
	"host" TEXT,
	"port" INT,
	"shard" bigint
)
STABLE SECURITY DEFINER PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'nodes_of_wrapper';
COMMENT ON FUNCTION rate_limit.nodes_of(text[]) IS
    'Under Citus, the node (host, port) and shard that hold each key, in the order given: where to send its calls';

-- rate_limit.take_batch(policy, keys, costs, all_or_nothing): decisions for many keys in one statement (#31).
CREATE FUNCTION rate_limit."take_batch"(
	"policy" TEXT,
	"keys" TEXT[],
	"costs" INT[] DEFAULT NULL,
	"all_or_nothing" bool DEFAULT false
) RETURNS TABLE (
	"ordinality" INT,
	"key" TEXT,
	"allowed" bool,
	"remaining" bigint,
	"retry_after" interval
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'take_batch_wrapper';
COMMENT ON FUNCTION rate_limit.take_batch(text, text[], integer[], boolean) IS
    'Take costs[i] tokens (1 each by default) from bucket keys[i] of a policy for every key in order; one row per key';

-- Monitoring for Prometheus (#30): the metrics views, their functions, and pg_monitor's grants.
CREATE FUNCTION rate_limit."metrics_rows"() RETURNS TABLE (
	"kind" TEXT,
	"policy" TEXT,
	"calls" bigint,
	"granted" bigint,
	"denied" bigint,
	"shadow_denied" bigint,
	"blocked" bigint,
	"tokens_granted" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'metrics_rows_wrapper';
CREATE FUNCTION rate_limit."node_metrics_rows"() RETURNS TABLE (
	"kind" TEXT,
	"policy" TEXT,
	"calls" bigint,
	"granted" bigint,
	"denied" bigint,
	"shadow_denied" bigint,
	"blocked" bigint,
	"tokens_granted" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'node_metrics_rows_wrapper';
CREATE FUNCTION rate_limit."purge_rows"() RETURNS TABLE (
	"store" TEXT,
	"finished_at" timestamp with time zone,
	"freed" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'purge_rows_wrapper';
CREATE FUNCTION rate_limit."metrics_top_keys_rows"() RETURNS TABLE (
	"kind" TEXT,
	"policy" TEXT,
	"rank" INT,
	"key" TEXT,
	"denials" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'metrics_top_keys_rows_wrapper';

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

-- Each policy's numbers as gauges: rate tokens per period_seconds, at most burst at once (a window's limit;
-- a concurrency policy's leases), and for a concurrency policy the leases held now.
CREATE VIEW rate_limit.metrics_policies AS
SELECT pg_catalog.current_database()::text AS database, p.name AS policy, p.algorithm, p.rate,
       pg_catalog.date_part('epoch', p.per) AS period_seconds, p.burst, p.shadow, l.held AS leases_held
FROM rate_limit.policies AS p
LEFT JOIN rate_limit.leases_held_rows() AS l ON l.policy COLLATE "C" = p.name;
COMMENT ON VIEW rate_limit.metrics_policies IS
    'Each policy''s rate, period, burst and shadow mode, and the leases held of a concurrency policy; owner and pg_monitor';

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
REVOKE EXECUTE ON FUNCTION rate_limit.metrics_rows(), rate_limit.node_metrics_rows(),
    rate_limit.leases_held_rows(), rate_limit.purge_rows(), rate_limit.metrics_top_keys_rows() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limit.metrics_rows(), rate_limit.node_metrics_rows(),
    rate_limit.leases_held_rows(), rate_limit.purge_rows(), rate_limit.metrics_top_keys_rows() TO pg_monitor;
COMMENT ON FUNCTION rate_limit.metrics_rows() IS 'Internal: the rows of rate_limit.metrics';
COMMENT ON FUNCTION rate_limit.node_metrics_rows() IS
    'Internal: this node''s own rows of rate_limit.metrics (on a Citus coordinator the view sums every node''s)';
COMMENT ON FUNCTION rate_limit.leases_held_rows() IS 'Internal: the leases held of each concurrency policy, for rate_limit.metrics_policies';
COMMENT ON FUNCTION rate_limit.purge_rows() IS 'Internal: the rows of rate_limit.metrics_purge';
COMMENT ON FUNCTION rate_limit.metrics_top_keys_rows() IS 'Internal: the rows of rate_limit.metrics_top_keys';

-- Per-key overrides (#30, read per key since #40): the table, set_override and clear_override, the view,
-- and the trigger that tells every backend of a change.
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

CREATE FUNCTION rate_limit."set_override"(
	"policy" TEXT,
	"key" TEXT,
	"rate" bigint DEFAULT NULL,
	"per" interval DEFAULT NULL,
	"burst" bigint DEFAULT NULL,
	"action" TEXT DEFAULT 'limit',
	"until" timestamp with time zone DEFAULT NULL,
	"note" TEXT DEFAULT NULL
) RETURNS VOID
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_override_wrapper';
CREATE FUNCTION rate_limit."clear_override"(
	"policy" TEXT,
	"key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'clear_override_wrapper';

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
REVOKE EXECUTE ON FUNCTION rate_limit.set_override FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.clear_override(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.drop_policy(text) IS 'Drop a policy, its overrides and its table-store buckets; owner only';
COMMENT ON FUNCTION rate_limit.set_override IS
    'Give one key of a policy its own rate, per or burst (action limit), or deny or exempt it, until a time or for ever; owner only';
COMMENT ON FUNCTION rate_limit.clear_override(text, text) IS
    'Remove the override of a key: it follows its policy again; true if there was one; owner only';

-- Hardening (#40): the trigger function of the extension's own tables is the owner's. Before, any role
-- could attach it to a table of its own, and each of its commits made every backend of the database
-- forget its cached policies. It also refuses, when it fires, any table but rate_limit.policies and
-- rate_limit.key_overrides (in the library).
REVOKE EXECUTE ON FUNCTION rate_limit.policies_changed() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.policies_changed() IS
    'Trigger: a change of rate_limit.policies or rate_limit.key_overrides is seen by every backend''s next transaction; a direct call is refused';

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
