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
