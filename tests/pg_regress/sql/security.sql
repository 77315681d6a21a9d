-- An ordinary role must not run its own operators with the extension owner's privileges through
-- pg_fencing's internal statements (search_path is pinned while they run).
\set SHOW_CONTEXT never
CREATE ROLE mallory LOGIN;
CREATE SCHEMA mal AUTHORIZATION mallory;
CREATE TABLE victim (id int PRIMARY KEY, v text);
SELECT fencing_protect('victim', 'victim-res');
GRANT ALL ON victim TO mallory;
SET ROLE mallory;
CREATE FUNCTION mal.lt(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'mallory' THEN EXECUTE 'ALTER ROLE mallory SUPERUSER'; END IF;
    RETURN $1 OPERATOR(pg_catalog.<) $2;
END $$;
CREATE OPERATOR mal.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = mal.lt);
CREATE FUNCTION mal.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'mallory' THEN EXECUTE 'ALTER ROLE mallory SUPERUSER'; END IF;
    RETURN $1 OPERATOR(pg_catalog.=) $2;
END $$;
CREATE OPERATOR mal.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.eq);
SET search_path = mal, pg_catalog, public;
SELECT public.fencing_advance('mal-res', 1);
SELECT public.fencing_advance('mal-res', 2);
BEGIN; SET LOCAL pg_fencing.token = '3'; INSERT INTO public.victim VALUES (1, 'x'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '4'; UPDATE public.victim SET v = 'y'; COMMIT;
RESET search_path;
RESET ROLE;
SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory';
SELECT fencing_high_water('mal-res'), fencing_high_water('victim-res');
DROP TABLE victim;
DROP SCHEMA mal CASCADE;
DROP ROLE mallory;
