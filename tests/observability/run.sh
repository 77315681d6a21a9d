#!/usr/bin/env bash
# Observability test, on a cluster that preloads pg_fencing and pg_stat_statements:
#   * every refused write is logged exactly once (also through fenced_* and multi-row statements),
#     at pg_fencing.log_rejections, with the resource or row, the token, the high-water mark,
#     application_name, client address and backend pid; `off` logs nothing; `warning` also tells
#     the client; only a superuser may change the level;
#   * fencing_resources / fencing_protected_tables show accepted and rejected counts and the last
#     rejection with its origin (application_name and client address only to pg_read_all_stats);
#   * the recommended ways of passing a token (set_config(..., true) with a parameter, fenced_*)
#     add a fixed number of pg_stat_statements entries however many calls and tokens there are,
#     while statements of different shapes add one each (the negative control of the method);
#     SET LOCAL with a literal adds one per token on 15, one in all on 18.
# Usage: tests/observability/run.sh   (pg_fencing's current build must be installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python
PGPORT_TEST=${PGPORT_OBSERVABILITY:-54359}
fail=0
ok() { echo "  PASS: $*"; }
bad() { echo "  FAIL: $*" >&2; fail=1; }
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM

PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing, pg_stat_statements'
pg_stat_statements.track = all
log_min_messages = warning
log_line_prefix = '%m [%p] '" pg_start
LOG="$WORK/postgres.log"
q() { psql -X -v ON_ERROR_STOP=1 -q -At "$@"; }
q -c "CREATE DATABASE obs"
export PGDATABASE=obs
q >/dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE EXTENSION pg_stat_statements;
CREATE TABLE ledger (entry int PRIMARY KEY, amount bigint);
SELECT fencing_protect('ledger', 'settlement');
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint);
SELECT fencing_protect('accounts');
BEGIN; SET LOCAL pg_fencing.token = '7';
INSERT INTO ledger VALUES (1, 0), (2, 0);
INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 5) g;
COMMIT;
CREATE ROLE observer LOGIN;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO observer;
GRANT INSERT ON ledger TO observer;
SQL

# reloaded <setting> <value>: after ALTER SYSTEM and pg_reload_conf(), waits (up to 30 s) until a
# new session has the value, i.e. until the postmaster has read the file again (a new backend
# takes its settings from it).
reloaded() {
    local got=""
    for _ in $(seq 1 300); do
        got=$(psql -X -Atc "SHOW $1" 2>/dev/null || true)
        [ "$got" = "$2" ] && return 0
        sleep 0.1
    done
    bad "$1 is still '$got' 30 s after the reload, not '$2'"
}
# Lines our rejection log wrote so far.
log_lines() { grep -F "pg_fencing refused a write" "$LOG" || true; }
count_lines() { log_lines | grep -cF "$1" || true; }

echo "-- a stale plain UPDATE (resource mode) from application_name zombie-1 over TCP"
out=$(PGAPPNAME=zombie-1 psql -X -At -c "SELECT pg_backend_pid()" \
      -c "BEGIN" -c "SET LOCAL pg_fencing.token = '5'" -c "UPDATE ledger SET amount = 1" -c "COMMIT" 2>&1 || true)
pid=$(head -1 <<<"$out")
grep -q "FT001\|stale fencing token 5" <<<"$out" || grep -q "stale fencing token 5" <<<"$out" || bad "the stale UPDATE was not refused: $out"
line=$(log_lines | grep -F "backend pid $pid" || true)
want="pg_fencing refused a write (FT001): stale fencing token 5 for resource \"settlement\", whose high-water mark is 7; application_name \"zombie-1\", client 127.0.0.1:"
if [ "$(grep -c . <<<"$line")" = 1 ] && grep -qF "$want" <<<"$line" && grep -qE "client 127\.0\.0\.1:[0-9]+, backend pid $pid\$" <<<"$line"; then
    ok "logged once: ${line#* LOG:  }"
else
    bad "expected exactly one log line with '$want…, backend pid $pid', got: '$line'"
fi

echo "-- an expired PostgreSQL lease's token (FT003): one line; fencing_lease_check and _renew, not writes: none"
lt=$(q -c "SELECT fencing_lease_acquire('obs-lease', '1 millisecond')")
until [ "$(q -c "SELECT count(*) FROM fencing_leases WHERE name = 'obs-lease' AND NOT live")" = 1 ]; do sleep 0.05; done
PGAPPNAME=zombie-lease psql -X -q -c "BEGIN" -c "SET LOCAL pg_fencing.token = '$lt'" -c "UPDATE ledger SET amount = 1" -c "COMMIT" >/dev/null 2>&1 || true
PGAPPNAME=zombie-check psql -X -q -c "SELECT fencing_lease_check($lt)" -c "SELECT fencing_lease_renew($lt)" >/dev/null 2>&1 || true
nl=$(count_lines 'application_name "zombie-lease"'); nc=$(count_lines 'application_name "zombie-check"')
if [ "$nl" = 1 ] && [ "$nc" = 0 ] && log_lines | grep -F zombie-lease | grep -qF "pg_fencing refused a write (FT003): fencing token $lt, which no live PostgreSQL lease holds: Lease "'\"obs-lease\"'" with this token expired at"; then
    ok "logged once: $(log_lines | grep -F zombie-lease | sed 's/.* LOG:  //')"
else
    bad "expected one FT003 line for zombie-lease and none for zombie-check, got $nl and $nc: $(log_lines | grep -F zombie- | grep -v zombie-1)"
fi

echo "-- verbose errors name the function, the source file and the line (LOCATION)"
q -c "CREATE TABLE loc_t (id int PRIMARY KEY, v int)" -c "SELECT fencing_protect('loc_t', 'loc')" -c "SELECT fencing_advance('loc', 5)" >/dev/null
out=$(psql -X -q -v VERBOSITY=verbose -c "BEGIN" -c "SET LOCAL pg_fencing.token = '1'" -c "INSERT INTO loc_t VALUES (9, 9)" 2>&1 || true)
loc=$(grep '^LOCATION:' <<<"$out" || true)
grep -qE '^LOCATION:  [a-z_ A-Za-z]+, [a-z_]+\.rs:[1-9][0-9]*$' <<<"$loc" && ok "INSERT: $loc" || bad "INSERT: expected 'LOCATION:  FUNCTION, FILE.rs:LINE', got: $(tr "\n" "|" <<<"$out")"
out=$(psql -X -q -v VERBOSITY=verbose -c "SELECT fencing_protect('loc_t')" -c "BEGIN" -c "SET LOCAL pg_fencing.token = '7'" -c "INSERT INTO loc_t VALUES (9, 9)" -c "COMMIT" -c "SELECT fenced_update('loc_t', '{\"id\": 9}', '{\"v\": 1}', 6)" 2>&1 || true)
loc=$(grep '^LOCATION:' <<<"$out" | tail -1 || true)
grep -qE '^LOCATION:  [a-z_]+, [a-z_]+\.rs:[1-9][0-9]*$' <<<"$loc" && ok "fenced_update (per-row mode): $loc" || bad "fenced_update: expected 'LOCATION:  FUNCTION, FILE.rs:LINE', got: $out"

echo "-- a stale multi-row UPDATE and a stale fenced_update (per-row mode, nested statement): one line each"
before=$(log_lines | grep -c . || true)
PGAPPNAME=zombie-2 psql -X -q -c "BEGIN" -c "SET LOCAL pg_fencing.token = '3'" -c "UPDATE accounts SET balance = 1" -c "COMMIT" >/dev/null 2>&1 || true
PGAPPNAME=zombie-3 psql -X -q -c "SELECT fenced_update('accounts', '{\"id\": 4}', '{\"balance\": 9}', 2)" >/dev/null 2>&1 || true
after=$(log_lines | grep -c . || true)
n2=$(count_lines 'application_name "zombie-2"'); n3=$(count_lines 'application_name "zombie-3"')
if [ $((after - before)) = 2 ] && [ "$n2" = 1 ] && [ "$n3" = 1 ]; then
    ok "two refused statements, two lines: $(log_lines | grep -F zombie-3 | sed 's/.* LOG:  //')"
else
    bad "expected one line per refused statement, got $((after - before)) (zombie-2: $n2, zombie-3: $n3)"
fi
log_lines | grep -F 'zombie-3' | grep -qF 'stale fencing token 2 for row "(4)" of table "public.accounts", whose high-water mark is 7' \
    && ok "the row, token and mark are named" || bad "the zombie-3 line does not name row (4), token 2 and mark 7"

echo "-- an accepted write is not logged; a rejection caught by the client's own savepoint is"
before=$(log_lines | grep -c . || true)
q -c "BEGIN" -c "SET LOCAL pg_fencing.token = '8'" -c "UPDATE ledger SET amount = 2" -c "COMMIT"
q -c "DO \$\$ BEGIN PERFORM set_config('pg_fencing.token', '6', true); UPDATE ledger SET amount = 3; EXCEPTION WHEN sqlstate 'FT001' THEN NULL; END \$\$" >/dev/null
after=$(log_lines | grep -c . || true)
[ $((after - before)) = 1 ] && ok "1 line for 1 accepted + 1 caught rejection" || bad "expected 1 new line, got $((after - before))"

echo "-- pg_fencing.log_rejections"
q -c "ALTER SYSTEM SET pg_fencing.log_rejections = off" -c "SELECT pg_reload_conf()" >/dev/null
reloaded pg_fencing.log_rejections off
before=$(log_lines | grep -c . || true)
PGAPPNAME=quiet psql -X -q -c "BEGIN" -c "SET LOCAL pg_fencing.token = '1'" -c "UPDATE ledger SET amount = 1" -c "COMMIT" >/dev/null 2>&1 || true
after=$(log_lines | grep -c . || true)
[ "$before" = "$after" ] && ok "off: the rejection is not logged" || bad "off: $((after - before)) lines were logged"
q -c "ALTER SYSTEM SET pg_fencing.log_rejections = warning" -c "SELECT pg_reload_conf()" >/dev/null
reloaded pg_fencing.log_rejections warning
out=$(psql -X -q -c "BEGIN" -c "SET LOCAL pg_fencing.token = '1'" -c "UPDATE ledger SET amount = 1" -c "COMMIT" 2>&1 || true)
grep -q "^WARNING:  pg_fencing refused a write (FT001)" <<<"$out" && ok "warning: the client is told too" || bad "warning: client got: $out"
q -c "ALTER SYSTEM RESET pg_fencing.log_rejections" -c "SELECT pg_reload_conf()" >/dev/null
reloaded pg_fencing.log_rejections log
out=$(psql -X -q -U observer -c "SET pg_fencing.log_rejections = off" 2>&1 || true)
grep -q "permission denied to set parameter" <<<"$out" && ok "an ordinary role cannot silence the log: $out" \
    || bad "an ordinary role could set pg_fencing.log_rejections: $out"

echo "-- the views: counts and the last rejection with its origin"
got=$(q -c "SELECT accepted > 0, rejected, last_rejected_token, last_rejection_high_water, last_rejection_application_name, last_rejection_client_addr LIKE '127.0.0.1:%' FROM fencing_resources WHERE resource = 'settlement'")
# Rejected on settlement so far: zombie-1, the DO block, quiet, and the warning run = 4.
[ "$got" = "t|4|1|8|psql|t" ] && ok "fencing_resources: accepted>0, rejected 4, last token 1 vs mark 8, from psql at 127.0.0.1" \
    || bad "fencing_resources gives '$got', want 't|4|1|8|psql|t'"
got=$(q -c "SELECT rejected, last_rejected_token, last_rejection_high_water, last_rejection_pid > 0, last_rejection_application_name FROM fencing_protected_tables WHERE relation = 'accounts'::regclass")
[ "$got" = "2|2|7|t|zombie-3" ] && ok "fencing_protected_tables: rejected 2, last token 2 vs mark 7 from zombie-3" \
    || bad "fencing_protected_tables gives '$got', want '2|2|7|t|zombie-3'"
got=$(psql -X -At -U observer -c "SELECT rejected, last_rejected_token, last_rejection_application_name, last_rejection_client_addr IS NULL FROM fencing_resources WHERE resource = 'settlement'")
[ "$got" = "4|1|psql|t" ] && ok "another role sees the counts and application_name but not the client address (as in pg_stat_activity)" \
    || bad "observer sees '$got', want '4|1|psql|t'"
q -c "GRANT pg_read_all_stats TO observer"
got=$(psql -X -At -U observer -c "SELECT last_rejection_client_addr LIKE '127.0.0.1:%' FROM fencing_resources WHERE resource = 'settlement'")
[ "$got" = "t" ] && ok "a member of pg_read_all_stats sees the client address" || bad "pg_read_all_stats member sees '$got'"
q -c "REVOKE pg_read_all_stats FROM observer"
psql -X -q -U observer -c "BEGIN" -c "SET LOCAL pg_fencing.token = '2'" -c "INSERT INTO ledger VALUES (9, 9)" -c "COMMIT" >/dev/null 2>&1 || true
got=$(psql -X -At -U observer -c "SELECT last_rejected_token, last_rejection_client_addr LIKE '127.0.0.1:%' FROM fencing_resources WHERE resource = 'settlement'")
[ "$got" = "2|t" ] && ok "a role sees the client address of its own rejected sessions" || bad "observer's own rejection: '$got', want '2|t'"

echo "-- names longer than the 63 bytes kept in shared memory are told apart"
long=$(printf 'x%.0s' $(seq 1 63))
q >/dev/null <<SQL
CREATE TABLE la (id int PRIMARY KEY); SELECT fencing_protect('la', '$long');
CREATE TABLE lb (id int PRIMARY KEY); SELECT fencing_protect('lb', '$long-zombie-target');
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO la VALUES (1); INSERT INTO lb VALUES (1); COMMIT;
SQL
PGAPPNAME=lb-zombie psql -X -q -c "BEGIN" -c "SET LOCAL pg_fencing.token = '3'" -c "UPDATE lb SET id = 2" -c "COMMIT" >/dev/null 2>&1 || true
got=$(q -c "SELECT string_agg(coalesce(rejected, -1) || ':' || coalesce(last_rejection_application_name, '-'), ',' ORDER BY resource) FROM fencing_resources WHERE resource LIKE 'xxx%'")
[ "$got" = "0:-,1:lb-zombie" ] && ok "one row per resource, each with its own counts: $got" \
    || bad "long resource names: fencing_resources gives '$got', want '0:-,1:lb-zombie'"

echo "-- application_name cannot pose as the log line's other fields"
PGAPPNAME='x", client 10.9.8.7:4242, backend pid 1 --' psql -X -q -c "BEGIN" -c "SET LOCAL pg_fencing.token = '1'" -c "UPDATE ledger SET amount = 1" -c "COMMIT" >/dev/null 2>&1 || true
line=$(log_lines | grep -F '10.9.8.7' || true)
grep -qF 'application_name "x\", client 10.9.8.7:4242, backend pid 1 --", client 127.0.0.1:' <<<"$line" \
    && ok "the quote is escaped: ${line#* LOG:  }" || bad "application_name is not escaped: '$line'"
q -c "SELECT fencing_advance(E'r\"; application_name \"forged\"\\nLOG:  all good', 10)" >/dev/null
psql -X -q -c "SELECT fencing_advance(E'r\"; application_name \"forged\"\\nLOG:  all good', 9)" >/dev/null 2>&1 || true
line=$(log_lines | grep -F 'forged' || true)
if [ "$(grep -c . <<<"$line")" = 1 ] && grep -qF 'for resource "r\"; application_name \"forged\"\nLOG:  all good", whose high-water mark is 10' <<<"$line" \
        && ! grep -q '^LOG:  all good' "$LOG"; then
    ok "a resource name with a quote and a newline is escaped on one line: ${line#* LOG:  }"
else
    bad "resource name not escaped: '$line'"
fi

echo "-- pg_stat_statements: the recommended token forms add no entries per call"
entries() { q -c "SELECT count(*) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'obs') AND query NOT LIKE '%pg_stat_statements%'"; }
calls() {  # $1 first token, $2 count: set_config with a parameter + UPDATE, and fenced_update
    "$PY" - "$1" "$2" "$PGPORT_TEST" <<'PY'
import sys, psycopg2
first, n, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="obs")
cur = c.cursor()
for t in range(first, first + n):
    cur.execute("SELECT set_config('pg_fencing.token', %s, true)", (str(t),))
    cur.execute("UPDATE ledger SET amount = %s WHERE entry = %s", (t, 1 + t % 2))
    c.commit()
    cur.execute("SELECT fenced_update('accounts', %s, %s, %s)", ('{"id": %d}' % (1 + t % 5), '{"balance": %d}' % t, t))
    c.commit()
c.close()
PY
}
statements() { q -c "SELECT calls, toplevel, regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'obs') AND query NOT LIKE '%pg_stat_statements%' ORDER BY 3, 2"; }
q -c "SELECT pg_stat_statements_reset()" >/dev/null
calls 100 20
e1=$(entries)
statements >"$WORK/statements-1.txt"
calls 200 200
e2=$(entries)
statements >"$WORK/statements-2.txt"
[ "$e1" = "$e2" ] || diff "$WORK/statements-1.txt" "$WORK/statements-2.txt" || true
[ "$e1" = "$e2" ] && ok "20 calls: $e1 entries; 200 more calls with 200 new tokens: $e2 entries" \
    || bad "pg_stat_statements grew from $e1 to $e2 entries with more calls"
# Negative control of the method: 20 statements of 20 different shapes (1 to 20 output columns)
# must add 20 entries.
for n in $(seq 1 20); do echo "SELECT $(seq -s, 1 "$n") FROM ledger WHERE entry = 0;"; done | q >/dev/null
e3=$(entries)
[ $((e3 - e2)) -ge 20 ] && ok "negative control: 20 statements of different shapes added $((e3 - e2)) entries" \
    || bad "negative control: 20 statements of different shapes added only $((e3 - e2)) entries; the method cannot see flooding"
# SET LOCAL with a literal token is a utility statement whose text PostgreSQL 15 does not
# normalise, so every token is a new entry there; 18 normalises SET's values (one entry).
for t in $(seq 1000 1019); do echo "BEGIN; SET LOCAL pg_fencing.token = '$t'; UPDATE ledger SET amount = 0 WHERE entry = 1; COMMIT;"; done | q >/dev/null
e4=$(entries)
SERVER_MAJOR=$(q -Atc "SELECT current_setting('server_version_num')::int / 10000")
if [ "$SERVER_MAJOR" -lt 18 ]; then
    [ $((e4 - e3)) -ge 20 ] && ok "on $SERVER_MAJOR, 20 SET LOCAL with literal tokens added $((e4 - e3)) entries" \
        || bad "on $SERVER_MAJOR, 20 SET LOCAL with literal tokens added only $((e4 - e3)) entries"
else
    [ $((e4 - e3)) -le 2 ] && ok "on $SERVER_MAJOR, 20 SET LOCAL with literal tokens added $((e4 - e3)) entries (SET's values are normalised)" \
        || bad "on $SERVER_MAJOR, 20 SET LOCAL with literal tokens added $((e4 - e3)) entries"
fi

if [ $fail -ne 0 ]; then
    echo "observability test: FAILED (server log: $LOG)" >&2
    KEEP_WORK=1
    exit 1
fi
echo "observability test: all checks passed"
