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
