-- rate_limit bootstrap: runs first in CREATE EXTENSION, before the generated functions.
-- Owns the schema, the state table, the decision type and the policies table; all are members of the
-- extension and go with DROP EXTENSION.

CREATE SCHEMA rate_limit;
COMMENT ON SCHEMA rate_limit IS 'rate_limit: bucket state, policies, the limiter API and its views';

-- One row per bucket of the table store, keyed (namespace, key). The namespace is a policy's name, or
-- '#ad_hoc' for the ad-hoc limits of rate_limit.take_ad_hoc, or '#request' for the buckets of
-- rate_limiting_request ('#' cannot start a policy name). A missing row is a full bucket, so rows that
-- have refilled can be deleted losslessly (rate_limit.purge()). level is in the unit of the row's own
-- algorithm and numbers (see src/algorithm.rs): ticks of 1/per_us token for token_bucket, tokens used in
-- the current window for fixed_window, previous << 32 | current for sliding_window. Read it through
-- rate_limit.buckets. Written only by the extension's SECURITY DEFINER functions.
CREATE TABLE rate_limit.bucket_state (
    namespace  text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,   -- byte-wise equality and the fastest comparisons
    level      bigint      NOT NULL,
    updated_at timestamptz NOT NULL,        -- server clock (clock_timestamp()) of the last grant
    algorithm  text        NOT NULL,        -- the numbers the level was written under
    rate       bigint      NOT NULL,
    per_us     bigint      NOT NULL,
    burst      bigint      NOT NULL,
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 70);
-- No CHECK constraint: the functions validate every value, and PostgreSQL re-reads a CHECK expression at
-- each UPDATE's executor start, which costs more than the rest of the update. fillfactor 70 leaves room on
-- each page so that updates stay HOT (no index insertion, pruned in place).
COMMENT ON TABLE rate_limit.bucket_state IS
    'rate_limit table store: one row per (namespace, key) bucket; read it through rate_limit.buckets';

-- What every call of the limiter API returns (rate_limit.take, take_many, take_ad_hoc, peek, wait, refund).
CREATE TYPE rate_limit.decision AS (
    allowed     boolean,   -- were the tokens granted (by every policy of a multi-limit call)
    remaining   bigint,    -- whole tokens left in the reported bucket, never negative
    "limit"     bigint,    -- that bucket's capacity (burst)
    retry_after interval,  -- when denied: time until the cost could be granted; NULL if allowed or never
    reset_after interval,  -- time until the reported bucket is full again
    policy      text,      -- the reported policy: the violated one when denied; NULL for ad-hoc limits
    shadow_denied boolean, -- a limit in shadow mode would have denied this (allowed) call; it is reported
    lease       bigint     -- the lease an acquire got (concurrency policies), for release; NULL otherwise
);
COMMENT ON TYPE rate_limit.decision IS
    'Result of rate_limit.take / take_many / take_ad_hoc / peek / wait / charge / refund / acquire: allowed, remaining, limit, retry_after, reset_after, policy, shadow_denied, lease';

-- Named policies. Readable by everyone, written only through rate_limit.create_policy / alter_policy /
-- drop_policy (owner only). An extension configuration table: pg_dump dumps its rows.
CREATE TABLE rate_limit.policies (
    name       text COLLATE "C" PRIMARY KEY,
    algorithm  text        NOT NULL
               CHECK (algorithm IN ('token_bucket', 'fixed_window', 'sliding_window', 'calendar_window',
                                    'concurrency')),
    rate       bigint      NOT NULL CHECK (rate >= 1),
    per        interval    NOT NULL CHECK (per > interval '0'),
    burst      bigint      NOT NULL CHECK (burst >= 1),
    store      text        CHECK (store IN ('table', 'memory')),  -- NULL: the session's rate_limit.store
    created_at timestamptz NOT NULL,
    changed_at timestamptz NOT NULL,  -- when the numbers last changed: buckets carry over from this instant
    shadow     boolean     NOT NULL DEFAULT false,             -- never denies; would-be denials counted
    max_debt   bigint      NOT NULL DEFAULT 0 CHECK (max_debt >= 0), -- tokens below zero a charge may reach
    time_zone  text,         -- a calendar window's zone (canonical name); NULL for every other algorithm
    anchor     timestamp,    -- a calendar window's first start on that zone's clocks; NULL: its unit's start
    -- the penalty box: block_after denials of a key within one window (per) block it for block_for
    block_after bigint CHECK (block_after >= 1),
    block_for  interval CHECK (block_for > interval '0'),
    -- set by the first rate_limit.block of a key and by removing the penalty box: calls read a key's block
    -- only for a policy with a penalty box or with this
    blocks_by_hand boolean NOT NULL DEFAULT false,
    -- options (create_policy / alter_policy's options jsonb, one column each):
    description text CHECK (pg_catalog.length(description) <= 1000), -- for the people who run it
    -- an adaptive concurrency policy: each key's limit between adaptive_min (NULL: 1) and rate
    adaptive_min bigint CHECK (adaptive_min >= 1),
    latency_target interval CHECK (latency_target > interval '0'), -- NULL: fixed leases
    -- weighted meters: what a unit of each named quantity costs in tokens (reserve and settle's amounts)
    meters jsonb CHECK (pg_catalog.jsonb_typeof(meters) = 'object'),
    -- a hierarchy: a call on this policy also takes from its parent's bucket of the same key (one level)
    parent text CHECK (parent <> name),
    CONSTRAINT policies_calendar_check
        CHECK ((algorithm = 'calendar_window') = (time_zone IS NOT NULL) AND (anchor IS NULL OR time_zone IS NOT NULL)),
    CONSTRAINT policies_block_check CHECK ((block_after IS NULL) = (block_for IS NULL))
);
COMMENT ON TABLE rate_limit.policies IS
    'rate_limit named policies: rate tokens per per, at most burst; change them with rate_limit.alter_policy';
SELECT pg_catalog.pg_extension_config_dump('rate_limit.policies', '');

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

-- Policies dropped (DELETE or TRUNCATE of rate_limit.policies) whose memory-store buckets have not been
-- freed yet: written by the policies_dropped trigger in the dropping transaction, emptied by the
-- background worker's round in this database and by rate_limit.purge(). The memory store keys a policy's
-- buckets by (name, created_at) and frees them only once the drop has committed. Owner only; not dumped.
CREATE TABLE rate_limit.dropped_policies (
    name       text COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL
);
COMMENT ON TABLE rate_limit.dropped_policies IS
    'Internal: dropped policies whose memory-store buckets the background worker has not freed yet';
