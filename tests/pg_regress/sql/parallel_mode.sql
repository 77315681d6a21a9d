-- A write to a protected table from a function wrongly declared PARALLEL SAFE, run under a
-- parallel plan: PostgreSQL's own answer for a write during a parallel operation (25000), as on
-- an unprotected table, never XX000 (issue 42, item 7). src/rule/mod.rs, `write_token`.
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE TABLE par_plain (id int PRIMARY KEY, v int);
CREATE TABLE par_res (id int PRIMARY KEY, v int);
SELECT fencing_protect('par_res', 'par-res');
CREATE TABLE par_row (id int PRIMARY KEY, v int);
SELECT fencing_protect('par_row');
CREATE TABLE par_src AS SELECT g AS i FROM generate_series(1, 1000) g;
ANALYZE par_src;
CREATE FUNCTION par_write(tab text, i int) RETURNS int LANGUAGE plpgsql PARALLEL SAFE AS $$
BEGIN
    EXECUTE format('INSERT INTO %I VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET v = 2', tab) USING i;
    RETURN i;
END $$;
CREATE FUNCTION par_delete(i int) RETURNS int LANGUAGE sql PARALLEL SAFE AS $$
    DELETE FROM par_row WHERE id = i RETURNING id
$$;
CREATE FUNCTION par_write_sql(i int) RETURNS int LANGUAGE sql PARALLEL SAFE AS $$
    UPDATE par_row SET v = 3 WHERE id = i RETURNING id
$$;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO par_row VALUES (1, 1); INSERT INTO par_res VALUES (1, 1); COMMIT;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT count(par_write('par_plain', i)) FROM par_src; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT count(par_write('par_res', i)) FROM par_src; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT count(par_write('par_row', i)) FROM par_src; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT count(par_write_sql(i)) FROM par_src; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT count(par_delete(i)) FROM par_src; ROLLBACK;
-- The whole query in a worker (debug_parallel_query on 16 and later, force_parallel_mode on 15).
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', false) IS NOT NULL AS forced;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT par_write('par_plain', 7); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT par_write('par_res', 7); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT par_write('par_row', 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT par_write_sql(1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; SELECT par_delete(1); ROLLBACK;
RESET ALL;
SELECT id, v, fence_token FROM par_row;
