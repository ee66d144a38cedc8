-- rate_limit 0.3.0 -> 0.4.0. Assembled by scripts/assemble-upgrade.sh from sql/unreleased/*.sql,
-- one fragment per change: edit those, then assemble again. Frozen once 0.4.0 is in sql/RELEASED.
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.4.0'" to load this file. \quit

-- reset_stats(NULL) reset everything; now a NULL policy is 22004 and reset_stats() resets everything.
DROP FUNCTION rate_limit.reset_stats(text);
CREATE FUNCTION rate_limit."reset_stats"() RETURNS bigint
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_all_stats_wrapper';
CREATE FUNCTION rate_limit."reset_stats"(
    "policy" TEXT
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_stats_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.reset_stats(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.reset_stats() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.reset_stats(text) IS
    'Zero the statistics and top limited keys of a policy in this database; owner only';
COMMENT ON FUNCTION rate_limit.reset_stats() IS
    'Zero every statistic and top limited key of this database; owner only';

-- memory_usage() shows the current database's and login role's shares of the memory store.
DROP FUNCTION rate_limit.memory_usage();
CREATE FUNCTION rate_limit."memory_usage"() RETURNS TABLE (
    "max_buckets" bigint,
    "buckets" bigint,
    "partitions" bigint,
    "slots" bigint,
    "slot_bytes" bigint,
    "total_bytes" bigint,
    "bytes_per_bucket" bigint,
    "lossless_evictions" bigint,
    "lossy_evictions" bigint,
    "refused_full" bigint,
    "share_percent" bigint,
    "share_buckets" bigint,
    "database_buckets" bigint,
    "role_share_percent" bigint,
    "role_share_buckets" bigint,
    "role_buckets" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'memory_usage_wrapper';
COMMENT ON FUNCTION rate_limit.memory_usage() IS
    'Size and use of the memory store: buckets, slots, bytes per bucket, evictions, this database''s and this role''s shares';

-- Every database's buckets in the memory store, for operators.
CREATE FUNCTION rate_limit."memory_shares"() RETURNS TABLE (
    "database" TEXT,
    "buckets" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'memory_shares_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.memory_shares() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.memory_shares() IS
    'Buckets each database holds in the memory store; owner only';

-- The table store's helpers are pure (the caller passes its clock reading) and IMMUTABLE, so that Citus can
-- route the table store's UPDATE to a key's shard. state_after_take gets a new C symbol (0.3.0's read the
-- clock; the library keeps that symbol, refusing with 55000 until this update) and a last argument, where
-- a calendar window opened by the take ends.
-- effective_now is gone: the UPDATE takes GREATEST(now, updated_at) and the caller rebases after a step.
DROP FUNCTION rate_limit.effective_now(timestamptz, timestamptz);
DROP FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint);
CREATE FUNCTION rate_limit."state_after_take"(
    "level" bigint,
    "updated_at" timestamp with time zone,
    "algorithm" TEXT,
    "rate" bigint,
    "per_us" bigint,
    "burst" bigint,
    "new_algorithm" TEXT,
    "new_rate" bigint,
    "new_per_us" bigint,
    "new_burst" bigint,
    "changed_at" timestamp with time zone,
    "now" timestamp with time zone,
    "cost" bigint,
    "window_end" timestamp with time zone
) RETURNS bigint
STRICT IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'state_after_take_at_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint, timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.state_after_take(bigint, timestamptz, text, bigint, bigint, bigint,
    text, bigint, bigint, bigint, timestamptz, timestamptz, bigint, timestamptz) IS
    'Internal: the level of a stored row after a take, or -1 if short (the table store''s UPDATE)';
ALTER FUNCTION rate_limit.state_tokens(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz)
    IMMUTABLE;
ALTER FUNCTION rate_limit.state_is_full(bigint, timestamptz, text, bigint, bigint, bigint, timestamptz)
    IMMUTABLE;

-- Memory buckets of a dropped policy are freed once the drop has committed.
CREATE TABLE rate_limit.dropped_policies (
    name       text COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL
);
COMMENT ON TABLE rate_limit.dropped_policies IS
    'Internal: dropped policies whose memory-store buckets the background worker has not freed yet';
CREATE FUNCTION rate_limit.policies_dropped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        INSERT INTO rate_limit.dropped_policies (name, created_at)
        SELECT d.name, d.created_at FROM dropped AS d;
    ELSE -- TRUNCATE, before it runs
        INSERT INTO rate_limit.dropped_policies (name, created_at)
        SELECT p.name, p.created_at FROM rate_limit.policies AS p;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER policies_dropped
    AFTER DELETE ON rate_limit.policies REFERENCING OLD TABLE AS dropped
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limit.policies_dropped();
CREATE TRIGGER policies_truncated
    BEFORE TRUNCATE ON rate_limit.policies
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limit.policies_dropped();
REVOKE ALL ON TABLE rate_limit.dropped_policies FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.policies_dropped() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.policies_dropped() IS
    'Trigger: records dropped policies in rate_limit.dropped_policies, for the memory store';

-- Citus: rate_limit.distribute() sets a cluster up (src/cluster/citus.rs).
CREATE FUNCTION rate_limit."distribute"(
	"shard_count" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"object" TEXT,  /* String */
	"action" TEXT  /* String */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'distribute_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.distribute(integer) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.distribute(integer) IS
    'On a Citus coordinator: policies as a reference table, state distributed by key, keyed calls delegated '
    'to the key''s node; idempotent; owner only';

-- Citus: on the coordinator the statistics views merge every node's own rows, which these give
-- (src/cluster/merged.rs).
CREATE FUNCTION rate_limit."node_top_limited_rows"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"policy" TEXT,  /* Option < String > */
	"rank" INT,  /* i32 */
	"key" TEXT,  /* String */
	"denials" bigint,  /* i64 */
	"denials_min" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'node_top_limited_rows_wrapper';
CREATE FUNCTION rate_limit."node_stats_rows"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"policy" TEXT,  /* Option < String > */
	"calls" bigint,  /* i64 */
	"granted" bigint,  /* i64 */
	"denied" bigint,  /* i64 */
	"tokens_granted" bigint,  /* i64 */
	"last_denial" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"since" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'node_stats_rows_wrapper';
CREATE FUNCTION rate_limit."node_memory_buckets"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"policy" TEXT,  /* Option < String > */
	"key" TEXT,  /* String */
	"tokens" NUMERIC,  /* AnyNumeric */
	"limit" bigint,  /* i64 */
	"rate" bigint,  /* i64 */
	"per" interval,  /* Option < Interval > */
	"algorithm" TEXT,  /* String */
	"updated_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE SECURITY DEFINER PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'node_memory_buckets_rows_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.node_stats_rows() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.node_top_limited_rows() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rate_limit.node_memory_buckets() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.node_stats_rows() IS
    'This node''s own rows of rate_limit.stats (on a Citus coordinator the view merges every node''s); owner only';
COMMENT ON FUNCTION rate_limit.node_top_limited_rows() IS
    'This node''s own rows of rate_limit.top_limited (on a Citus coordinator the view merges every node''s); owner only';
COMMENT ON FUNCTION rate_limit.node_memory_buckets() IS
    'This node''s own memory-store buckets (on a Citus coordinator rate_limit.buckets lists every node''s); owner only';

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

-- Shadow mode and charges with debt: two policy settings, the decision's shadow_denied, rate_limit.charge.
ALTER TABLE rate_limit.policies
    ADD COLUMN shadow   boolean NOT NULL DEFAULT false,
    ADD COLUMN max_debt bigint  NOT NULL DEFAULT 0 CHECK (max_debt >= 0);
ALTER TYPE rate_limit.decision ADD ATTRIBUTE shadow_denied boolean;
ALTER TYPE rate_limit.decision ADD ATTRIBUTE lease bigint;
-- Calendar windows: a fourth algorithm, with its time zone and anchor.
ALTER TABLE rate_limit.policies
    DROP CONSTRAINT policies_algorithm_check,
    ADD CONSTRAINT policies_algorithm_check
        CHECK (algorithm IN ('token_bucket', 'fixed_window', 'sliding_window', 'calendar_window',
                             'concurrency')),
    ADD COLUMN time_zone text,
    ADD COLUMN anchor    timestamp,
    ADD CONSTRAINT policies_calendar_check
        CHECK ((algorithm = 'calendar_window') = (time_zone IS NOT NULL) AND (anchor IS NULL OR time_zone IS NOT NULL));
-- Blocks: the penalty box of a policy.
ALTER TABLE rate_limit.policies
    ADD COLUMN block_after bigint CHECK (block_after >= 1),
    ADD COLUMN block_for   interval CHECK (block_for > interval '0'),
    ADD CONSTRAINT policies_block_check CHECK ((block_after IS NULL) = (block_for IS NULL));
COMMENT ON TYPE rate_limit.decision IS
    'Result of rate_limit.take / take_many / take_ad_hoc / peek / wait / charge / refund / acquire: allowed, remaining, limit, retry_after, reset_after, policy, shadow_denied, lease';
DROP FUNCTION rate_limit.create_policy(text, bigint, interval, bigint, text, text);
CREATE FUNCTION rate_limit."create_policy"(
    "name" TEXT,
    "rate" bigint,
    "per" interval,
    "burst" bigint DEFAULT NULL,
    "algorithm" TEXT DEFAULT 'token_bucket',
    "store" TEXT DEFAULT NULL,
    "shadow" bool DEFAULT false,
    "max_debt" bigint DEFAULT 0,
    "time_zone" TEXT DEFAULT NULL,
    "anchor" timestamp DEFAULT NULL,
    "block_after" bigint DEFAULT NULL,
    "block_for" interval DEFAULT NULL,
    "options" jsonb DEFAULT NULL
) RETURNS VOID
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'create_policy_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.create_policy FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.create_policy IS
    'Create a named policy: rate tokens per per, at most burst; algorithm, store, shadow, max_debt, time_zone, anchor, block_after, block_for and options (jsonb, by name) optional; owner only';
DROP FUNCTION rate_limit.alter_policy(text, bigint, interval, bigint, text);
CREATE FUNCTION rate_limit."alter_policy"(
    "name" TEXT,
    "rate" bigint DEFAULT NULL,
    "per" interval DEFAULT NULL,
    "burst" bigint DEFAULT NULL,
    "algorithm" TEXT DEFAULT NULL,
    "shadow" bool DEFAULT NULL,
    "max_debt" bigint DEFAULT NULL,
    "time_zone" TEXT DEFAULT NULL,
    "anchor" timestamp DEFAULT NULL,
    "block_after" bigint DEFAULT NULL,
    "block_for" interval DEFAULT NULL,
    "options" jsonb DEFAULT NULL
) RETURNS VOID
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'alter_policy_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.alter_policy FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.alter_policy IS
    'Change a policy (NULL keeps a value; in options, an option left out keeps its value and null clears it); buckets carry their tokens over, never gaining any; owner only';
CREATE FUNCTION rate_limit."charge"(
    "policy" TEXT,
    "key" TEXT,
    "cost" bigint
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'charge_wrapper';
COMMENT ON FUNCTION rate_limit.charge(text, text, bigint) IS
    'Charge cost tokens to bucket key of a policy after the fact: always taken, down to its max_debt below zero';

-- Concurrency leases: acquire and release.
CREATE FUNCTION rate_limit."acquire"(
    "policy" TEXT,
    "key" TEXT
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'acquire_wrapper';
COMMENT ON FUNCTION rate_limit.acquire(text, text) IS
    'Acquire a lease of key under a concurrency policy: the decision, with the lease id when allowed';
CREATE FUNCTION rate_limit."release"(
    "policy" TEXT,
    "key" TEXT,
    "lease" bigint
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_wrapper';
COMMENT ON FUNCTION rate_limit.release(text, text, bigint) IS
    'Release a lease acquired with rate_limit.acquire: true if it was held and is now free';

-- Blocks by hand (owner only).
CREATE FUNCTION rate_limit."block"(
    "policy" TEXT,
    "key" TEXT,
    "duration" interval
) RETURNS rate_limit.decision
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'block_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.block(text, text, interval) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.block(text, text, interval) IS
    'Block key under a policy for duration: its calls are denied without touching its bucket; owner only';
CREATE FUNCTION rate_limit."unblock"(
    "policy" TEXT,
    "key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'unblock_wrapper';
REVOKE EXECUTE ON FUNCTION rate_limit.unblock(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.unblock(text, text) IS
    'Lift the block of key under a policy and forget its penalty box count; true if it was blocked; owner only';

-- Every function has a comment (the SQL surface's catalog test checks it): the policy cache's trigger too.
COMMENT ON FUNCTION rate_limit.policies_changed() IS
    'Trigger: every change of rate_limit.policies invalidates every backend''s policy cache; a direct call is refused';

-- A key's block is read only where one can exist: for a policy with a penalty box, or once a key of it was
-- blocked by hand (or its penalty box removed). No policy of 0.3.0 has a block.
ALTER TABLE rate_limit.policies
    ADD COLUMN blocks_by_hand boolean NOT NULL DEFAULT false;

-- Policy options (create_policy / alter_policy's options jsonb): one column each, the first `description`.
ALTER TABLE rate_limit.policies
    ADD COLUMN description text CHECK (pg_catalog.length(description) <= 1000);
