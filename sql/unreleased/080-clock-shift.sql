-- The table store's clock shift (a promoted standby whose clock was off its primary's keeps reading rows on
-- the clock they were written on), and the buckets view's tokens on that clock.
CREATE FUNCTION rate_limit."clock_shift"() RETURNS interval
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'clock_shift_wrapper';
COMMENT ON FUNCTION rate_limit.clock_shift() IS
    'How far the table store''s clock is behind clock_timestamp() (non-zero after promoting a standby whose clock was off)';
CREATE OR REPLACE VIEW rate_limit.buckets AS
SELECT CASE s.namespace WHEN '#request' THEN 'request' WHEN '#ad_hoc' THEN 'ad_hoc' ELSE 'policy' END AS kind,
       -- a concurrency policy's lease slots are namespaced policy || chr(31) || slot: named by their policy
       CASE WHEN s.namespace IN ('#request', '#ad_hoc') THEN NULL ELSE split_part(s.namespace, chr(31), 1) END
         AS policy,
       s.key,
       rate_limit.state_tokens(s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst,
                               clock_timestamp() - rate_limit.clock_shift()) AS tokens,
       s.burst AS "limit",
       s.rate,
       s.per_us * interval '1 microsecond' AS per,
       s.algorithm,
       s.updated_at,
       'table'::text AS store
FROM rate_limit.bucket_state AS s
UNION ALL
SELECT m.kind, m.policy, m.key, m.tokens, m."limit", m.rate, m.per, m.algorithm, m.updated_at, 'memory'::text
FROM rate_limit.memory_buckets() AS m;
