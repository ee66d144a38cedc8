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
