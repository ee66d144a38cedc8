-- Hierarchical quotas (create_policy / alter_policy option parent): a call on a child policy also takes
-- from its parent's bucket of the same key, all or nothing.
ALTER TABLE rate_limit.policies
    ADD COLUMN parent text CHECK (parent <> name);
