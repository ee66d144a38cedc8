-- The owner's views, the monitoring views, the privileges and the comments (sql/finalize.sql's).

-- Every bucket with its tokens now (exact, rounded down to the millionth). Owner only.
CREATE VIEW rate_limit.buckets AS
SELECT CASE s.namespace WHEN '#request' THEN 'request' WHEN '#ad_hoc' THEN 'ad_hoc' ELSE 'policy' END AS kind,
       CASE WHEN s.namespace IN ('#request', '#ad_hoc') THEN NULL
            ELSE pg_catalog.split_part(s.namespace, pg_catalog.chr(31), 1) END AS policy,
       s.key,
       pg_catalog.round(rate_limit._tokens_millionths(
                 ROW(s.algorithm, s.rate, s.per_us, s.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
                 s.level, rate_limit._us(s.updated_at), rate_limit._now())::numeric / 1000000, 6) AS tokens,
       s.burst AS "limit",
       s.rate,
       s.per_us * interval '1 microsecond' AS per,
       s.algorithm,
       s.updated_at,
       'table'::text AS store
FROM rate_limit.bucket_state AS s;
COMMENT ON VIEW rate_limit.buckets IS
    'Buckets of the table store (policy, ad-hoc and rate_limiting_request) with their tokens now; full ones may be purged';

-- Held leases of each concurrency policy, counted as the owner (pg_monitor reads the counts, never the
-- keys): each policy's slot rows, read by primary key.
CREATE FUNCTION rate_limit.leases_held_rows() RETURNS TABLE (policy text, held bigint)
LANGUAGE sql STABLE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT p.name::text,
       (SELECT count(*) FROM rate_limit.bucket_state AS s
         WHERE s.namespace = ANY (ARRAY(SELECT p.name || chr(31) || g::text FROM generate_series(0, p.rate - 1) AS g))
           AND rate_limit._slot_held(ROW(s.algorithm, s.rate, s.per_us, s.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
                                     s.level, rate_limit._us(s.updated_at), rate_limit._now()))
FROM rate_limit.policies AS p
WHERE p.algorithm = 'concurrency'
$$;

-- Each adaptive concurrency policy's keys under a cut limit, read as the owner (pg_monitor reads the
-- aggregates, never the keys): how many, the lowest limit in force and their mean, in leases (the
-- policy's most when no key is cut). A key's limit is a row beside its slots (namespace name U+001F
-- "adaptive limit"), read by primary key; one past its forgetting (a lease TTL after its last cut) is full.
CREATE FUNCTION rate_limit.adaptive_limits_rows()
RETURNS TABLE (policy text, limited_keys bigint, lowest_limit float8, mean_limit float8)
LANGUAGE sql STABLE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
WITH limits AS (
    SELECT p.name, p.rate,
           rate_limit._tokens_millionths(
               ROW(s.algorithm, s.rate, s.per_us, s.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
               s.level, rate_limit._us(s.updated_at), rate_limit._now())::numeric / 1000000 AS tokens
    FROM rate_limit.policies AS p
    JOIN rate_limit.bucket_state AS s ON s.namespace = p.name || chr(31) || 'adaptive limit'
    WHERE p.latency_target IS NOT NULL)
SELECT p.name::text, count(l.tokens),
       COALESCE(min(l.tokens), p.rate)::float8, COALESCE(avg(l.tokens), p.rate)::float8
FROM rate_limit.policies AS p
LEFT JOIN limits AS l ON l.name = p.name AND l.tokens < l.rate
WHERE p.latency_target IS NOT NULL
GROUP BY p.name, p.rate
$$;

-- Each policy's numbers as gauges, the leases held of a concurrency policy and an adaptive one's cut limits:
-- what postgres_exporter reads (monitoring/queries-portable.yaml). Owner and pg_monitor.
CREATE VIEW rate_limit.metrics_policies AS
SELECT pg_catalog.current_database()::text AS database, p.name AS policy, p.algorithm, p.rate,
       pg_catalog.date_part('epoch', p.per) AS period_seconds, p.burst, p.shadow, l.held AS leases_held,
       a.limited_keys AS adaptive_limited_keys, a.lowest_limit AS adaptive_lowest_limit,
       a.mean_limit AS adaptive_mean_limit
FROM rate_limit.policies AS p
LEFT JOIN rate_limit.leases_held_rows() AS l ON l.policy COLLATE "C" OPERATOR(pg_catalog.=) p.name
LEFT JOIN rate_limit.adaptive_limits_rows() AS a ON a.policy COLLATE "C" OPERATOR(pg_catalog.=) p.name;
COMMENT ON VIEW rate_limit.metrics_policies IS
    'Each policy''s rate, period, burst and shadow mode, the leases held of a concurrency policy, and an adaptive one''s keys under a cut limit; owner and pg_monitor';

-- The last finished rate_limit.purge or purge_idle (the portable edition has no background worker:
-- schedule CALL rate_limit.purge_idle() with pg_cron).
CREATE VIEW rate_limit.metrics_purge AS
SELECT pg_catalog.current_database()::text AS database, p.store, p.finished_at, p.freed
FROM rate_limit.purges AS p;
COMMENT ON VIEW rate_limit.metrics_purge IS
    'When rate_limit.purge or purge_idle last finished and what it deleted; owner and pg_monitor';

-- Security model: any role may take, peek and wait, and read the policies; only the owner (the role that
-- installed this edition, and roles it grants) may change policies, refund, reset, block, purge and list
-- buckets. The state tables are closed to PUBLIC; the functions that write them are SECURITY DEFINER.
-- Internal helpers are not executable by PUBLIC: only the owner's functions call them.
GRANT USAGE ON SCHEMA rate_limit TO PUBLIC;
REVOKE ALL ON TABLE rate_limit.bucket_state, rate_limit.key_overrides, rate_limit.purges, rate_limit.overrides,
    rate_limit.buckets, rate_limit._fast_policies FROM PUBLIC;
REVOKE ALL ON TABLE rate_limit.policies FROM PUBLIC;
GRANT SELECT ON TABLE rate_limit.policies TO PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rate_limit FROM PUBLIC;
REVOKE EXECUTE ON ALL PROCEDURES IN SCHEMA rate_limit FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    rate_limit.peek_request(text, integer, integer),
    rate_limit.tokens(text, integer, integer),
    rate_limit.take(text, text, integer),
    rate_limit.take_many(text[], text[], integer),
    rate_limit.take_batch(text, text[], integer[], boolean),
    rate_limit.take_ad_hoc(text, bigint, interval, bigint, integer),
    rate_limit.peek(text, text),
    rate_limit.wait(text, text, integer, interval),
    rate_limit.charge(text, text, bigint),
    rate_limit.acquire(text, text),
    rate_limit.release(text, text, bigint, text, interval),
    rate_limit.reserve(text, text, bigint, interval, jsonb),
    rate_limit.settle(text, text, bigint, bigint, jsonb),
    rate_limit.reserve_many(text[], text, bigint[], interval, jsonb),
    rate_limit.settle_many(text[], text, bigint, bigint[], jsonb),
    rate_limit.book(text, text, bigint, interval),
    rate_limit.cancel_booking(text, text, bigint),
    rate_limit.headers(rate_limit.decision, text),
    rate_limit.limit_writes()
TO PUBLIC;
GRANT EXECUTE ON FUNCTION rate_limiting_request(text, integer, integer) TO PUBLIC;
-- the monitoring views: the owner and pg_monitor
REVOKE ALL ON TABLE rate_limit.metrics_policies, rate_limit.metrics_purge FROM PUBLIC;
GRANT SELECT ON TABLE rate_limit.metrics_policies, rate_limit.metrics_purge TO pg_monitor;
GRANT EXECUTE ON FUNCTION rate_limit.leases_held_rows(), rate_limit.adaptive_limits_rows() TO pg_monitor;

-- The comments of the functions both editions have are the compiled edition's, in sql/finalize.sql:
-- portable/assemble.sh appends them to the assembled file. These two say what differs here.
COMMENT ON FUNCTION rate_limit.purge() IS
    'Delete every bucket that is full now (lossless); returns how many; owner only';
COMMENT ON FUNCTION rate_limit.drop_policy(text) IS 'Drop a policy, its overrides and its buckets; owner only';

-- Every internal helper says so.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc AS p
              WHERE p.pronamespace = 'rate_limit'::regnamespace AND p.proname LIKE '\_%'
    LOOP
        EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %L', f,
            'Internal (portable edition): called only by the edition''s own functions');
    END LOOP;
END
$$;
