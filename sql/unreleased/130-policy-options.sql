-- Policy options (create_policy / alter_policy's options jsonb): one column each, the first `description`.
ALTER TABLE rate_limit.policies
    ADD COLUMN description text CHECK (pg_catalog.length(description) <= 1000);
