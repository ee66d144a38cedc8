-- rate_limit portable edition: the schema, its tables and the decision type.
--
-- The same tables, columns and types as the compiled edition's (sql/bootstrap.sql), so that moving to the
-- compiled edition copies rows (portable/to-compiled.sql). Run by the database owner (psql -f), by
-- CREATE EXTENSION rate_limit_portable (a control file without a library), or by pg_tle: never as a
-- superuser necessarily, and never with a library. Every object lives in schema rate_limit except
-- rate_limiting_request, which is created in the first schema of the search_path the script runs with
-- (CREATE EXTENSION's schema), as the compiled edition creates it in the extension's schema.

CREATE SCHEMA rate_limit;
COMMENT ON SCHEMA rate_limit IS 'rate_limit (portable edition): bucket state, policies, the limiter API and its views';

-- One row per bucket, keyed (namespace, key): see the compiled edition's sql/bootstrap.sql. Written only by
-- this edition's SECURITY DEFINER functions.
CREATE TABLE rate_limit.bucket_state (
    namespace  text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    level      bigint      NOT NULL,
    updated_at timestamptz NOT NULL,
    algorithm  text        NOT NULL,
    rate       bigint      NOT NULL,
    per_us     bigint      NOT NULL,
    burst      bigint      NOT NULL,
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 70);
COMMENT ON TABLE rate_limit.bucket_state IS
    'rate_limit table store: one row per (namespace, key) bucket; read it through rate_limit.buckets';

CREATE TYPE rate_limit.decision AS (
    allowed     boolean,
    remaining   bigint,
    "limit"     bigint,
    retry_after interval,
    reset_after interval,
    policy      text,
    shadow_denied boolean,
    lease       bigint
);
COMMENT ON TYPE rate_limit.decision IS
    'Result of rate_limit.take / take_many / take_ad_hoc / peek / wait / charge / refund / acquire: allowed, remaining, limit, retry_after, reset_after, policy, shadow_denied, lease';

CREATE TABLE rate_limit.policies (
    name       text COLLATE "C" PRIMARY KEY,
    algorithm  text        NOT NULL
               CHECK (algorithm IN ('token_bucket', 'fixed_window', 'sliding_window', 'calendar_window',
                                    'concurrency')),
    rate       bigint      NOT NULL CHECK (rate >= 1),
    per        interval    NOT NULL CHECK (per > interval '0'),
    burst      bigint      NOT NULL CHECK (burst >= 1),
    store      text        CHECK (store IN ('table', 'memory')),
    created_at timestamptz NOT NULL,
    changed_at timestamptz NOT NULL,
    shadow     boolean     NOT NULL DEFAULT false,
    max_debt   bigint      NOT NULL DEFAULT 0 CHECK (max_debt >= 0),
    time_zone  text,
    anchor     timestamp,
    block_after bigint CHECK (block_after >= 1),
    block_for  interval CHECK (block_for > interval '0'),
    blocks_by_hand boolean NOT NULL DEFAULT false,
    description text CHECK (pg_catalog.length(description) <= 1000),
    adaptive_min bigint CHECK (adaptive_min >= 1),
    latency_target interval CHECK (latency_target > interval '0'),
    meters jsonb CHECK (pg_catalog.jsonb_typeof(meters) = 'object'),
    -- a hierarchy: a call on this policy also takes from its parent's bucket of the same key (one level)
    parent text CHECK (parent <> name),
    CONSTRAINT policies_calendar_check
        CHECK ((algorithm = 'calendar_window') = (time_zone IS NOT NULL) AND (anchor IS NULL OR time_zone IS NOT NULL)),
    CONSTRAINT policies_block_check CHECK ((block_after IS NULL) = (block_for IS NULL))
);
COMMENT ON TABLE rate_limit.policies IS
    'rate_limit named policies: rate tokens per per, at most burst; change them with rate_limit.alter_policy';

CREATE TABLE rate_limit.key_overrides (
    policy     text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    action     text        NOT NULL CHECK (action IN ('limit', 'deny', 'exempt')),
    rate       bigint      CHECK (rate >= 1),
    per        interval    CHECK (per > interval '0'),
    burst      bigint      CHECK (burst >= 1),
    expires_at timestamptz,
    set_at     timestamptz NOT NULL,
    note       text CHECK (pg_catalog.length(note) <= 1000),
    PRIMARY KEY (policy, key),
    CONSTRAINT key_overrides_numbers_check
        CHECK ((action = 'limit') = (rate IS NOT NULL OR per IS NOT NULL OR burst IS NOT NULL))
);
COMMENT ON TABLE rate_limit.key_overrides IS
    'rate_limit per-key overrides of a policy; change them with rate_limit.set_override and clear_override';

-- The last purge (rate_limit.purge, from pg_cron or by hand): what rate_limit.metrics_purge shows. The
-- portable edition has no background worker; one row, written by purge.
CREATE TABLE rate_limit.purges (
    store       text        NOT NULL PRIMARY KEY CHECK (store = 'table'),
    finished_at timestamptz NOT NULL,
    freed       bigint      NOT NULL
);
COMMENT ON TABLE rate_limit.purges IS
    'Internal: when rate_limit.purge last finished and what it deleted, for rate_limit.metrics_purge';

-- pg_dump keeps the policies and overrides of an extension (CREATE EXTENSION or pg_tle); installed by
-- psql -f they are ordinary tables, dumped anyway.
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('rate_limit.policies', '');
    PERFORM pg_catalog.pg_extension_config_dump('rate_limit.key_overrides', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL; -- not run by CREATE EXTENSION
END
$$;
