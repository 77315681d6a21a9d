-- Everything the extension put in the catalog, as text, in a stable order: functions with their
-- full definitions and privileges, tables and views with their columns, view definitions,
-- privileges, comments, indexes, constraints, triggers, and the tables pg_dump dumps with their
-- filters. Two databases with the same extension objects print the same text; the upgrade test
-- compares an upgraded database with a fresh install this way.
\pset format unaligned
\pset tuples_only on
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'pg_fencing'),
members AS (
    SELECT d.classid, d.objid, d.objsubid
    FROM pg_depend d, ext
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
)
SELECT pg_describe_object(m.classid, m.objid, m.objsubid) || E'\n' ||
       CASE m.classid
           WHEN 'pg_proc'::regclass THEN
               pg_get_functiondef(m.objid) ||
               ' acl=' || coalesce((SELECT proacl::text FROM pg_proc WHERE oid = m.objid), '-')
           WHEN 'pg_class'::regclass THEN
               (SELECT c.relkind::text || ' acl=' || coalesce(c.relacl::text, '-') ||
                       ' columns=' || coalesce((SELECT string_agg(a.attname || ' ' ||
                                     format_type(a.atttypid, a.atttypmod) ||
                                     CASE WHEN a.attnotnull THEN ' not null' ELSE '' END ||
                                     coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), ''),
                                     ', ' ORDER BY a.attnum)
                                   FROM pg_attribute a
                                   LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                                   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '') ||
                       coalesce(E'\n' || pg_get_viewdef(c.oid), '')
                FROM pg_class c WHERE c.oid = m.objid)
           ELSE ''
       END || E'\n' ||
       'comment=' || coalesce(obj_description(m.objid, (SELECT relname FROM pg_class WHERE oid = m.classid)), '-')
FROM members m
ORDER BY 1;

SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = '_pg_fencing' ORDER BY 1;

SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = '_pg_fencing'::regnamespace ORDER BY 1;

SELECT 'trigger ' || pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = '_pg_fencing'::regnamespace AND NOT t.tgisinternal ORDER BY 1;

SELECT 'dumped ' || coalesce(extconfig::regclass[]::text, '-') || ' ' || coalesce(extcondition::text, '-') ||
       ' relocatable=' || extrelocatable || ' schema=' || extnamespace::regnamespace
FROM pg_extension WHERE extname = 'pg_fencing';

SELECT 'event trigger ' || evtname || ' on ' || evtevent || ' ' || evtfoid::regproc::text || ' ' ||
       coalesce(evttags::text, '-') || ' enabled=' || evtenabled::text
FROM pg_event_trigger ORDER BY 1;
