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

-- Owners of the extension's objects.
SELECT 'owner ' || pg_describe_object(d.classid, d.objid, 0) || ' ' ||
       coalesce((SELECT proowner::regrole::text FROM pg_proc WHERE d.classid = 'pg_proc'::regclass AND oid = d.objid),
                (SELECT relowner::regrole::text FROM pg_class WHERE d.classid = 'pg_class'::regclass AND oid = d.objid),
                (SELECT evtowner::regrole::text FROM pg_event_trigger WHERE d.classid = 'pg_event_trigger'::regclass AND oid = d.objid),
                (SELECT nspowner::regrole::text FROM pg_namespace WHERE d.classid = 'pg_namespace'::regclass AND oid = d.objid),
                '-')
FROM pg_depend d
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_fencing')
ORDER BY 1;

-- Storage options, sequences, column privileges and comments of the internal schema, and the
-- schema's own privileges.
SELECT 'reloptions ' || c.oid::regclass::text || ' ' || coalesce(c.reloptions::text, '-')
FROM pg_class c WHERE c.relnamespace = '_pg_fencing'::regnamespace ORDER BY 1;
SELECT 'sequence ' || s.seqrelid::regclass::text || ' ' || s.seqtypid::regtype::text || ' start ' || s.seqstart ||
       ' inc ' || s.seqincrement || ' min ' || s.seqmin || ' max ' || s.seqmax || ' cache ' || s.seqcache || ' cycle ' || s.seqcycle
FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = '_pg_fencing'::regnamespace ORDER BY 1;
SELECT 'column ' || a.attrelid::regclass::text || '.' || a.attname || ' acl=' || coalesce(a.attacl::text, '-') ||
       ' comment=' || coalesce(col_description(a.attrelid, a.attnum), '-')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = '_pg_fencing'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  AND (a.attacl IS NOT NULL OR col_description(a.attrelid, a.attnum) IS NOT NULL)
ORDER BY 1;
SELECT 'schema _pg_fencing acl=' || coalesce(nspacl::text, '-') || ' comment=' ||
       coalesce(obj_description(oid, 'pg_namespace'), '-')
FROM pg_namespace WHERE nspname = '_pg_fencing';
