-- Everything that makes up the installed extension, one sorted line per object: definition, privileges,
-- comment, and for relations their columns, constraints, indexes, triggers and options. Two databases
-- with the same output have the same extension, whichever way they got it.
WITH ext AS (
    SELECT oid, extconfig, extcondition FROM pg_catalog.pg_extension WHERE extname = 'rate_limit'
), members AS (
    SELECT d.classid, d.objid
    FROM pg_catalog.pg_depend AS d, ext
    WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
      AND d.refobjid = ext.oid AND d.deptype = 'e'
), described AS (
    SELECT pg_catalog.pg_describe_object(m.classid, m.objid, 0) AS object,
           CASE m.classid
           WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN
               pg_catalog.pg_get_functiondef(m.objid) || ' acl=' || coalesce(p.proacl::text, 'default')
           WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN
               'kind=' || c.relkind::text || ' options=' || coalesce(c.reloptions::text, '') || ' acl='
               || coalesce(c.relacl::text, 'default')
               || coalesce(' view=' || pg_catalog.pg_get_viewdef(m.objid), '')
               || ' columns=' || (SELECT string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
                                       || coalesce(' collate ' || co.collname, '')
                                       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                                       || coalesce(' default ' || pg_catalog.pg_get_expr(ad.adbin, ad.adrelid), ''),
                                       ', ' ORDER BY a.attnum)
                                  FROM pg_catalog.pg_attribute AS a
                                  LEFT JOIN pg_catalog.pg_collation AS co
                                         ON co.oid = a.attcollation AND a.attcollation <> 100
                                  LEFT JOIN pg_catalog.pg_attrdef AS ad
                                         ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                                  WHERE a.attrelid = m.objid AND a.attnum > 0 AND NOT a.attisdropped)
               || ' constraints=' || coalesce((SELECT string_agg(k.conname || ' ' || pg_catalog.pg_get_constraintdef(k.oid), ', ' ORDER BY k.conname)
                                      FROM pg_catalog.pg_constraint AS k WHERE k.conrelid = m.objid), '')
               || ' indexes=' || coalesce((SELECT string_agg(pg_catalog.pg_get_indexdef(i.indexrelid), ', ' ORDER BY 1)
                                  FROM pg_catalog.pg_index AS i WHERE i.indrelid = m.objid), '')
               || ' triggers=' || coalesce((SELECT string_agg(pg_catalog.pg_get_triggerdef(t.oid), ', ' ORDER BY t.tgname)
                                   FROM pg_catalog.pg_trigger AS t WHERE t.tgrelid = m.objid AND NOT t.tgisinternal), '')
           WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN
               'attributes=' || coalesce((SELECT string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                                  FROM pg_catalog.pg_attribute AS a
                                  WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped), '')
               || ' acl=' || coalesce(t.typacl::text, 'default')
           WHEN 'pg_catalog.pg_namespace'::pg_catalog.regclass THEN
               'acl=' || coalesce(n.nspacl::text, 'default')
           ELSE '' END AS definition,
           pg_catalog.obj_description(m.objid, (SELECT relname FROM pg_catalog.pg_class WHERE oid = m.classid)) AS comment
    FROM members AS m
    LEFT JOIN pg_catalog.pg_proc AS p ON m.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND p.oid = m.objid
    LEFT JOIN pg_catalog.pg_class AS c ON m.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.oid = m.objid
    LEFT JOIN pg_catalog.pg_type AS t ON m.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND t.oid = m.objid
    LEFT JOIN pg_catalog.pg_namespace AS n ON m.classid = 'pg_catalog.pg_namespace'::pg_catalog.regclass AND n.oid = m.objid
)
SELECT object || E'\n    ' || definition || E'\n    comment: ' || coalesce(comment, '(none)')
FROM described
UNION ALL
SELECT 'configuration tables: ' || (SELECT extconfig::pg_catalog.regclass[]::text || ' ' || coalesce(extcondition::text, '') FROM ext)
ORDER BY 1;
