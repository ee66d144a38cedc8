-- rate_limit.purge_idle() (the purge for pg_cron, in short transactions): the procedure; its span function,
-- rate_limit.purge_span, is in 000-new-functions.sql.
-- The purge to schedule with pg_cron where no background worker runs (docs/operations.md): the full
-- buckets untouched for idle, read 1 000 rows of the state table a transaction in the primary key's order,
-- committing after each, so that a caller waits at most one short transaction for a row the purge locked
-- and a bucket in use keeps its row (rate_limit.purge_span does each span). CALL it on its own, as pg_cron
-- does: inside a transaction block its first COMMIT fails with 2D000. A procedure that commits can be
-- neither SECURITY DEFINER nor carry a SET clause: it runs as its caller (owner only) and names everything
-- with its schema.
CREATE PROCEDURE rate_limit.purge_idle(idle pg_catalog.interval DEFAULT pg_catalog.interval '5 minutes')
LANGUAGE plpgsql
AS $$
DECLARE
    span record;
    after_namespace pg_catalog.text;
    after_key pg_catalog.text;
BEGIN
    LOOP
        SELECT s.deleted, s.next_namespace, s.next_key INTO span
          FROM rate_limit.purge_span(idle, after_namespace, after_key) AS s;
        COMMIT;
        EXIT WHEN span.next_key IS NULL;
        after_namespace := span.next_namespace;
        after_key := span.next_key;
    END LOOP;
END
$$;
