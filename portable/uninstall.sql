-- Removes the portable edition installed by psql -f (an extension is removed with DROP EXTENSION): its
-- schema rate_limit, with every policy, override and bucket in it, and its rate_limiting_request. Run by
-- its owner: psql -v ON_ERROR_STOP=1 -1 -f uninstall.sql
DO $$
DECLARE
    f regprocedure;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limit_portable') THEN
        RAISE EXCEPTION 'rate_limit_portable is installed as an extension: DROP EXTENSION rate_limit_portable';
    END IF;
    -- the edition's rate_limiting_request: the one whose fast path calls its rate_limit._request
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc AS p
              WHERE p.proname OPERATOR(pg_catalog.=) 'rate_limiting_request'
                AND p.prosrc LIKE '%rate_limit._request(%' LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f);
    END LOOP;
END
$$;
DROP SCHEMA rate_limit CASCADE;
