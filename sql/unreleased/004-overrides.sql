-- Per-key overrides (#30, read per key since #40): the table, the view (set_override and clear_override are
-- in 000-new-functions.sql), and the trigger that tells every backend of a change.
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
