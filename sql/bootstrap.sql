-- rate_limit bootstrap: runs first in CREATE EXTENSION, before the generated functions.
-- Owns the schema and the storage table; both are members of the extension and go with DROP EXTENSION.

CREATE SCHEMA rate_limit;
COMMENT ON SCHEMA rate_limit IS 'rate_limit: bucket state, management functions and views';

-- One row per bucket. A missing row is a full bucket, so rows that have refilled can be deleted losslessly
-- (rate_limit.purge()). Written only by the extension's SECURITY DEFINER functions.
CREATE TABLE rate_limit.bucket_state (
    id             text COLLATE "C" PRIMARY KEY,   -- byte-wise equality and the fastest comparisons
    level          bigint      NOT NULL,           -- tokens at updated_at, in millionths of a token
    updated_at     timestamptz NOT NULL,           -- server clock (clock_timestamp()) of the last grant
    refill_per_sec integer     NOT NULL,           -- the limit of the last granted call
    capacity       bigint      NOT NULL
) WITH (fillfactor = 70);
-- No CHECK constraint: the functions validate every value, and PostgreSQL re-reads a CHECK expression at
-- each UPDATE's executor start, which costs more than the rest of the update. fillfactor 70 leaves room on
-- each page so that updates stay HOT (no index insertion, pruned in place).
COMMENT ON TABLE rate_limit.bucket_state IS
    'rate_limit table store: one row per bucket; level is in millionths of a token';

-- What every call of the full limiter API returns (rate_limit.take, peek, wait, refund).
CREATE TYPE rate_limit.decision AS (
    allowed     boolean,   -- were the tokens granted (by every policy of a multi-limit call)
    remaining   bigint,    -- whole tokens left in the reported bucket, never negative
    "limit"     bigint,    -- that bucket's capacity (burst)
    retry_after interval,  -- when denied: time until the cost could be granted; NULL if allowed or never
    reset_after interval,  -- time until the reported bucket is full again
    policy      text       -- the reported policy: the violated one when denied; NULL for ad-hoc limits
);
COMMENT ON TYPE rate_limit.decision IS
    'Result of rate_limit.take / peek / wait / refund: allowed, remaining, limit, retry_after, reset_after, policy';

-- Named policies. Readable by everyone, written only through rate_limit.create_policy / alter_policy /
-- drop_policy (owner only). An extension configuration table: pg_dump dumps its rows.
CREATE TABLE rate_limit.policies (
    name       text COLLATE "C" PRIMARY KEY,
    algorithm  text        NOT NULL CHECK (algorithm IN ('token_bucket', 'fixed_window', 'sliding_window')),
    rate       bigint      NOT NULL CHECK (rate >= 1),
    per        interval    NOT NULL CHECK (per > interval '0'),
    burst      bigint      NOT NULL CHECK (burst >= 1),
    store      text        CHECK (store IN ('table', 'memory')),  -- NULL: the session's rate_limit.store
    created_at timestamptz NOT NULL,
    changed_at timestamptz NOT NULL   -- when the numbers last changed: buckets carry over from this instant
);
COMMENT ON TABLE rate_limit.policies IS
    'rate_limit named policies: rate tokens per per, at most burst; change them with rate_limit.alter_policy';
SELECT pg_catalog.pg_extension_config_dump('rate_limit.policies', '');

-- One row per (policy, key) bucket of the table store; policy '' holds the ad-hoc limits'
-- buckets. level is in the unit of the row's own algorithm and numbers (see src/algorithm.rs): ticks of
-- 1/per_us token for token_bucket, tokens used in the current window for fixed_window, and
-- previous << 32 | current for sliding_window. Read it through rate_limit.policy_buckets.
CREATE TABLE rate_limit.policy_state (
    policy     text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    level      bigint      NOT NULL,
    updated_at timestamptz NOT NULL,
    algorithm  text        NOT NULL,   -- the numbers the level was written under
    rate       bigint      NOT NULL,
    per_us     bigint      NOT NULL,
    burst      bigint      NOT NULL,
    PRIMARY KEY (policy, key)
) WITH (fillfactor = 70);
COMMENT ON TABLE rate_limit.policy_state IS
    'rate_limit table store of policy and ad-hoc buckets; read it through rate_limit.policy_buckets';
