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
