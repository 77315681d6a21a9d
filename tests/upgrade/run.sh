#!/usr/bin/env bash
# Upgrade test. For every released version V (sql/RELEASED.sha256), on a server that already runs
# the current library (as after installing a new package):
#   1. CREATE EXTENSION pg_fencing VERSION 'V' from the released script (sql/pg_fencing--V.sql),
#      protect tables in both modes, write with tokens, advance and reset a mark, delete a row
#      (tombstone), build a user view on one of ours, and check that V's SQL works with the
#      current library (a stale write is still refused with FT001);
#   2. ALTER EXTENSION pg_fencing UPDATE;
#   3. check that nothing was lost (marks, tombstones, protections, reset log, rows: byte for byte),
#      that fencing still holds (stale writes FT001, newer tokens accepted, tombstones fence
#      re-inserts), that the user's view survived, and that the new columns are filled;
#      A dump made under V restores into the current version with its tombstones hashed;
#   4. compare the upgraded catalog with a fresh CREATE EXTENSION of the current version
#      (tests/upgrade/catalog.sql): an upgrade script that misses or adds anything fails here.
# Also runs scripts/check-sql-releases.sh, with a negative control that edits a released script.
# Usage: tests/upgrade/run.sh   (pg_fencing's current build must be installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
source scripts/lib.sh
PGPORT_TEST=${PGPORT_UPGRADE:-54309}
CURRENT=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
EXTDIR="$($PGBIN/pg_config --sharedir)/extension"
ADDED=""
fail=0
ok() { echo "  PASS: $*"; }
bad() { echo "  FAIL: $*" >&2; fail=1; }

cleanup() {
    for f in $ADDED; do rm -f "$f"; done
    cleanup_all
}
fresh_workdir
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "-- released scripts are never edited (scripts/check-sql-releases.sh)"
scripts/check-sql-releases.sh
# Negative controls: an edited released script must be caught, by its checksum and, when the
# checksum is edited along with it, by git history.
mkdir -p "$WORK/tree"
cp -r Cargo.toml META.json sql "$WORK/tree/"
first_released=$(awk 'NR==1 {print $2}' sql/RELEASED.sha256)
echo "-- edited" >>"$WORK/tree/sql/$first_released"
if scripts/check-sql-releases.sh "$WORK/tree" >"$WORK/check.out" 2>&1; then
    bad "check-sql-releases.sh accepted an edited released script"
else
    ok "an edited released script is refused"
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ "$(git rev-parse --is-shallow-repository)" = false ] \
        && [ -n "$(git log --format=%H -- "sql/$first_released" | head -1)" ]; then
    git clone -q "$ROOT" "$WORK/clone"
    echo "-- edited" >>"$WORK/clone/sql/$first_released"
    (cd "$WORK/clone/sql" && { sha256sum "$first_released"; grep -vF "  $first_released" RELEASED.sha256 || true; } \
        >RELEASED.sha256.new && mv RELEASED.sha256.new RELEASED.sha256)
    if scripts/check-sql-releases.sh "$WORK/clone" >"$WORK/check2.out" 2>&1; then
        bad "check-sql-releases.sh accepted an edited released script whose checksum was edited too"
    else
        ok "an edited released script with an edited checksum is refused (git history)"
    fi
fi

PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
q() { psql -X -v ON_ERROR_STOP=1 -q -At "$@"; }
# Run SQL that must fail with SQLSTATE $2; prints the error line.
expect_error() {
    local db=$1 state=$2 sql=$3 out
    if out=$(psql -X -q -At -d "$db" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose \
            -c "\\set VERBOSITY verbose" -c "$sql" 2>&1); then
        bad "expected $state, but it succeeded: $sql"
    elif grep -q "ERROR:  $state" <<<"$out"; then
        ok "$state: $(grep -m1 "ERROR:" <<<"$out" | cut -c1-110)"
    else
        bad "expected $state from: $sql; got: $out"
    fi
}
snapshot() {
    q -d "$1" <<'SQL'
SELECT 'mark', resource, high_water, updated_at FROM _pg_fencing.resource_high_water ORDER BY resource;
SELECT 'protection', id, relid::text, resource, token_column, protected, protected_at FROM _pg_fencing.protected_table ORDER BY id;
SELECT 'tombstone', protection_id, key, high_water FROM _pg_fencing.row_tombstone ORDER BY 1, 2, 3;
SELECT 'reset', reset_at, reset_by, resource, old_high_water, new_high_water FROM _pg_fencing.reset_log ORDER BY 1;
SELECT 'account', a.* FROM accounts a ORDER BY id;
SELECT 'ledger', l.* FROM ledger l ORDER BY entry;
SELECT 'parted', p.* FROM parted p ORDER BY k;
SELECT 'view', m.* FROM my_marks m ORDER BY 1;
SQL
}

for released in $(awk '{print $2}' sql/RELEASED.sha256 | grep -E "^pg_fencing--[^-]+\.sql$"); do
    V=${released#pg_fencing--}; V=${V%.sql}
    [ "$V" = "$CURRENT" ] && continue
    echo "-- upgrade from released $V to $CURRENT"
    if [ ! -f "$EXTDIR/$released" ]; then
        cp "sql/$released" "$EXTDIR/$released"
        ADDED="$ADDED $EXTDIR/$released"
    fi
    db="upgrade_from_${V//./_}"
    q -c "CREATE DATABASE $db"
    q -d "$db" >/dev/null <<SQL
CREATE EXTENSION pg_fencing VERSION '$V';
-- per-row mode
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
SELECT fencing_protect('accounts');
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO accounts VALUES (1, 100), (2, 200), (3, 300);
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '20'; UPDATE accounts SET balance = 150 WHERE id = 1; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '30'; DELETE FROM accounts WHERE id = 3; COMMIT;
SELECT fenced_update('accounts', '{"id": 2}', '{"balance": 250}', 25);
-- resource mode, plain and partitioned
CREATE TABLE ledger (entry int PRIMARY KEY, amount bigint);
SELECT fencing_protect('ledger', 'settlement');
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO ledger VALUES (1, 5), (2, 7); COMMIT;
SELECT fencing_advance('settlement', 150);
CREATE TABLE parted (k int PRIMARY KEY, v text) PARTITION BY RANGE (k);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('parted', 'allocator');
BEGIN; SET LOCAL pg_fencing.token = '500'; INSERT INTO parted VALUES (1, 'a'), (50, 'b'); COMMIT;
SELECT fencing_reset('allocator', 400);
-- a partition in a schema that sorts after the root's, and a disabled trigger there: pg_dump then
-- puts an ALTER TABLE (DISABLE TRIGGER) between the root's guard and the partition's statement
-- triggers in its output
CREATE SCHEMA zparts;
CREATE TABLE zparts.parted_2 PARTITION OF parted FOR VALUES FROM (100) TO (200);
CREATE TABLE zparts.audit (x int);
CREATE FUNCTION zparts.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
CREATE TRIGGER audit BEFORE INSERT ON zparts.audit FOR EACH ROW EXECUTE FUNCTION zparts.noop();
ALTER TABLE zparts.audit DISABLE TRIGGER audit;
-- a user's view on one of ours must survive the upgrade
CREATE VIEW my_marks AS SELECT resource, high_water FROM fencing_resources;
-- per-row mode with a key whose equal values print differently: V matched tombstones by text
CREATE TABLE jobs_n (id numeric PRIMARY KEY);
SELECT fencing_protect('jobs_n');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jobs_n VALUES (1.0); DELETE FROM jobs_n; COMMIT;
SQL
    # The released SQL keeps working with the current library (the window between installing the
    # new package and ALTER EXTENSION ... UPDATE).
    expect_error "$db" FT001 "BEGIN; SET LOCAL pg_fencing.token = '140'; UPDATE ledger SET amount = 0; COMMIT;"
    expect_error "$db" FT001 "SELECT fenced_update('accounts', '{\"id\": 1}', '{\"balance\": 0}', 15)"
    q -d "$db" -c "SELECT count(*) FROM fencing_resources" >/dev/null && ok "$V's views work with the current library"

    snapshot "$db" >"$WORK/before.txt"
    # A dump made under V, restored into the current version (pg_dump names no version): its
    # tombstones come without key hashes, and get them when the restore creates the primary keys.
    pg_dump -Fc -d "$db" -f "$WORK/$db.old.dump"
    q -c "CREATE DATABASE ${db}_old_restored"
    pg_restore -d "${db}_old_restored" "$WORK/$db.old.dump" >"$WORK/old_restore.out" 2>&1 \
        || echo "  (pg_restore of $V's dump reported: $(grep -c 'ERROR' "$WORK/old_restore.out") errors)"
    # V's triggers lack what the current version's protections need (0.1.0: the REPLICA trigger):
    # such a protection is inactive and refuses writes (FT004) until fencing_protect completes it
    # (docs/operations.md, "Upgrading").
    expect_error "${db}_old_restored" FT004 "BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jobs_n VALUES (1.00); COMMIT;"
    q -d "${db}_old_restored" -c "SELECT fencing_protect(relid, resource, token_column) FROM _pg_fencing.protected_table WHERE protected" >/dev/null
    expect_error "${db}_old_restored" FT001 "BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jobs_n VALUES (1.00); COMMIT;"
    q -d "$db" -c "ALTER EXTENSION pg_fencing UPDATE"
    got=$(q -d "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_fencing'")
    [ "$got" = "$CURRENT" ] && ok "ALTER EXTENSION pg_fencing UPDATE: $V -> $got" || bad "extversion after update is $got, not $CURRENT"
    snapshot "$db" >"$WORK/after.txt"
    if diff -u "$WORK/before.txt" "$WORK/after.txt"; then
        ok "nothing lost: $(grep -c '' "$WORK/before.txt") rows of marks, tombstones, protections, reset log, data and the user's view are identical"
    else
        bad "state changed across the upgrade (diff above)"
    fi
    grep -q '^mark|settlement|150|' "$WORK/after.txt" && grep -q '^tombstone|.*|(3)|30$' "$WORK/after.txt" \
        && ok "the marks and tombstones checked are the ones written (settlement 150, tombstone of key 3 at 30)" \
        || bad "expected mark settlement=150 and tombstone (3)=30 in: $(cat "$WORK/after.txt")"

    # A partition of a per-row table dropped under V's SQL: V has no tombstone floor to carry its
    # rows' marks, so the current library refuses (55000, the hint asks for the update); after
    # the update DROP TABLE raises the floor to them first.
    q -c "CREATE DATABASE ${db}_drops"
    q -d "${db}_drops" >/dev/null <<SQL
CREATE EXTENSION pg_fencing VERSION '$V';
CREATE TABLE rows_p (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE rows_p_1 PARTITION OF rows_p FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('rows_p');
BEGIN; SET LOCAL pg_fencing.token = '40'; INSERT INTO rows_p VALUES (5, 0); COMMIT;
SQL
    expect_error "${db}_drops" 55000 "DROP TABLE rows_p_1"
    q -d "${db}_drops" -c "ALTER EXTENSION pg_fencing UPDATE" -c "DROP TABLE rows_p_1" >/dev/null 2>&1
    got=$(q -d "${db}_drops" -c "SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'rows_p'::regclass")
    [ "$got" = "40" ] && ok "after the update, DROP TABLE of the partition raises the floor to its rows' token (40)" \
        || bad "after the update, DROP TABLE of the partition left the floor at '$got' (want 40)"

    # Fencing after the upgrade.
    expect_error "$db" FT001 "BEGIN; SET LOCAL pg_fencing.token = '149'; UPDATE ledger SET amount = 0; COMMIT;"
    expect_error "$db" FT001 "BEGIN; SET LOCAL pg_fencing.token = '399'; UPDATE parted SET v = 'z'; COMMIT;"
    expect_error "$db" FT001 "BEGIN; SET LOCAL pg_fencing.token = '29'; INSERT INTO accounts VALUES (3, 1); COMMIT;"
    expect_error "$db" FT001 "SELECT fenced_update('accounts', '{\"id\": 1}', '{\"balance\": 0}', 19)"
    # The update hashed V's tombstones: an equal key printed otherwise meets its tombstone.
    expect_error "$db" FT001 "BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jobs_n VALUES (1.00); COMMIT;"
    q -d "$db" -c "BEGIN; SET LOCAL pg_fencing.token = '160'; UPDATE ledger SET amount = 9 WHERE entry = 1; COMMIT;"
    q -d "$db" -c "BEGIN; SET LOCAL pg_fencing.token = '31'; INSERT INTO accounts VALUES (3, 1); COMMIT;"
    got=$(q -d "$db" -c "SELECT fencing_high_water('settlement') || ' ' || (SELECT fence_token FROM accounts WHERE id = 3)")
    [ "$got" = "160 31" ] && ok "newer tokens are accepted and raise the marks (settlement 160, re-created key 3 at 31)" \
        || bad "after newer writes expected '160 31', got '$got'"
    got=$(q -d "$db" -c "SELECT string_agg(resource || '=' || high_water, ',' ORDER BY resource) FROM my_marks")
    [ "$got" = "allocator=400,settlement=160" ] && ok "the user's view on fencing_resources survived: $got" \
        || bad "user's view my_marks gives '$got'"
    got=$(q -d "$db" -c "SELECT rejected > 0, last_rejected_token, last_rejection_high_water, last_rejection_application_name, last_rejection_client_addr LIKE '127.0.0.1:%' FROM fencing_resources WHERE resource = 'settlement'")
    [ "$got" = "t|149|150|psql|t" ] && ok "new columns of fencing_resources are filled: $got" \
        || bad "fencing_resources' last rejection after the upgrade: '$got' (want t|149|150|psql|t)"
    got=$(q -d "$db" -c "SELECT last_rejected_token || ' ' || last_rejection_high_water || ' ' || (last_rejection_pid > 0) || ' ' || last_rejection_application_name FROM fencing_protected_tables WHERE relation = 'accounts'::regclass")
    [ "$got" = "19 20 true psql" ] && ok "new columns of fencing_protected_tables are filled: $got" \
        || bad "fencing_protected_tables' last rejection after the upgrade: '$got' (want '19 20 true psql')"

    # 0.2.0's tombstone floor and retention (fencing_prune_tombstones, fencing_tombstone_retention),
    # to be carried by the dumps below.
    q -d "$db" -c "SELECT fencing_prune_tombstones('accounts', 25)" -c "SELECT fencing_tombstone_retention('accounts', '1 day')" >/dev/null
    expect_error "$db" FT001 "BEGIN; SET LOCAL pg_fencing.token = '24'; INSERT INTO accounts VALUES (77, 1); COMMIT;"

    # pg_dump carries everything along: a restored copy keeps marks, tombstones and protections,
    # refuses stale writes, and can protect more tables (the protection ids' sequence came too).
    restored="${db}_restored"
    pg_dump -Fc -d "$db" -f "$WORK/$db.dump"
    q -c "CREATE DATABASE $restored"
    pg_restore -d "$restored" "$WORK/$db.dump"
    snapshot "$restored" | grep -v '^view|' >"$WORK/restored.txt"
    snapshot "$db" | grep -v '^view|' >"$WORK/source.txt"
    if diff -u "$WORK/source.txt" "$WORK/restored.txt" >/dev/null; then
        ok "pg_dump/pg_restore of the upgraded database keeps every mark, tombstone, protection and row"
    else
        diff -u "$WORK/source.txt" "$WORK/restored.txt" || true
        bad "the restored database differs from the upgraded one (diff above)"
    fi
    # The same as a plain SQL script, restored in one transaction that stops at the first error.
    pg_dump -d "$db" -f "$WORK/$db.sql"
    q -c "CREATE DATABASE ${restored}_plain"
    if out=$(psql -X -q -1 -v ON_ERROR_STOP=1 -d "${restored}_plain" -f "$WORK/$db.sql" 2>&1 >/dev/null); then
        ok "a plain pg_dump script restores with psql -1 -v ON_ERROR_STOP=1"
    else
        bad "plain restore failed: $out"
    fi
    for r in "$restored" "${restored}_plain"; do
        got=$(q -d "$r" -c "SELECT string_agg(relation::text || '=' || active, ',' ORDER BY relation::text) FROM fencing_protected_tables")
        [ "$got" = "accounts=true,jobs_n=true,ledger=true,parted=true" ] && ok "$r: every protection is active after the restore ($got)" \
            || bad "$r: protections after the restore: '$got'"
        got=$(q -d "$r" -c "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'zparts.parted_2'::regclass AND tgname LIKE 'zz_pg_fencing%' AND NOT tgisinternal")
        [ "$got" -ge 2 ] && ok "$r: the partition in another schema has its triggers ($got)" || bad "$r: zparts.parted_2 has $got triggers"
    done
    expect_error "$restored" FT001 "BEGIN; SET LOCAL pg_fencing.token = '159'; UPDATE ledger SET amount = 0; COMMIT;"
    expect_error "$restored" FT001 "BEGIN; SET LOCAL pg_fencing.token = '399'; TRUNCATE parted_1; COMMIT;"
    expect_error "${restored}_plain" FT001 "BEGIN; SET LOCAL pg_fencing.token = '399'; TRUNCATE zparts.parted_2; COMMIT;"
    floors="SELECT string_agg(relid::text || '=' || coalesce(tombstone_floor::text, '-') || '/' || coalesce(tombstone_retention::text, '-'), ',' ORDER BY id) FROM _pg_fencing.protected_table"
    want=$(q -d "$db" -c "$floors")
    for r in "$restored" "${restored}_plain"; do
        got=$(q -d "$r" -c "$floors")
        [ "$got" = "$want" ] && [[ "$got" == *"accounts=25/1 day"* ]] && ok "$r: tombstone floors and retentions are carried ($got)" \
            || bad "$r: floors/retentions '$got', source '$want'"
        expect_error "$r" FT001 "BEGIN; SET LOCAL pg_fencing.token = '24'; INSERT INTO accounts VALUES (77, 1); COMMIT;"
        expect_error "$r" FT001 "BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jobs_n VALUES (1.000); COMMIT;"
    done
    if got=$(q -d "$restored" -c "CREATE TABLE after_restore (id int PRIMARY KEY)" -c "SELECT fencing_protect('after_restore')" \
            -c "SELECT count(*) FROM _pg_fencing.protected_table" 2>&1 | tail -1); then
        ok "a table protected after the restore gets a new protection id ($got protections)"
    else
        bad "fencing_protect after pg_restore failed: $got"
    fi

    # The upgraded catalog equals a fresh install of the current version.
    fresh="fresh_${CURRENT//./_}"
    q -c "CREATE DATABASE $fresh"
    q -d "$fresh" -c "CREATE EXTENSION pg_fencing"
    q -d "$db" -f tests/upgrade/catalog.sql >"$WORK/catalog-upgraded.txt"
    q -d "$fresh" -f tests/upgrade/catalog.sql >"$WORK/catalog-fresh.txt"
    if diff -u "$WORK/catalog-fresh.txt" "$WORK/catalog-upgraded.txt"; then
        ok "the upgraded catalog equals a fresh install of $CURRENT ($(grep -c '^' "$WORK/catalog-fresh.txt") lines compared)"
    else
        bad "the upgraded catalog differs from a fresh install (diff above: - fresh, + upgraded)"
    fi
done

if [ $fail -ne 0 ]; then
    echo "upgrade test: FAILED" >&2
    exit 1
fi
echo "upgrade test: all checks passed"
