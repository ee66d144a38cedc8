-- module_pathname without $libdir (#41): the library is found through dynamic_library_path, as
-- CloudNativePG's image volumes need (extension_control_path and dynamic_library_path name the image's
-- directories; $libdir is the server's own). Every C function an earlier version created with
-- '$libdir/rate_limit' is redefined with 'rate_limit' (CREATE OR REPLACE keeps its oid, privileges,
-- comment and membership); a server whose dynamic_library_path is the default, '$libdir', finds the same
-- file.
DO $$
DECLARE
    f oid;
BEGIN
    FOR f IN SELECT p.oid
               FROM pg_catalog.pg_proc AS p
               JOIN pg_catalog.pg_depend AS d
                 ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.objid OPERATOR(pg_catalog.=) p.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
               JOIN pg_catalog.pg_extension AS e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
              WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limit'
                AND p.probin OPERATOR(pg_catalog.=) '$libdir/rate_limit'
    LOOP
        EXECUTE pg_catalog.replace(pg_catalog.pg_get_functiondef(f), 'AS ''$libdir/rate_limit'', ',
                                   'AS ''rate_limit'', ');
    END LOOP;
END
$$;
