-- Weighted meters (create_policy / alter_policy option meters): what a unit of each named quantity costs
-- in tokens, for reserve's and settle's amounts.
ALTER TABLE rate_limit.policies
    ADD COLUMN meters jsonb CHECK (pg_catalog.jsonb_typeof(meters) = 'object');
