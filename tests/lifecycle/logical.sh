#!/usr/bin/env bash
# Logical replication keeps the subscriber's marks and tombstones at least as high as what it has
# applied (issue 14, path 1). Changes applied by a subscription run with session_replication_role
# = replica, so the ordinary guard triggers do not fire there; pg_fencing's replica-mode triggers
# record what arrives instead of refusing it, and the publisher's own marks and tombstones travel
# through _pg_fencing.resource_high_water and _pg_fencing.tombstone_feed.
#
#   publisher 127.0.0.1:${PGPORT_LOGICAL:-54439}, subscriber the next port; wal_level = logical;
#   the tables' shape as PGF_SHAPE says (scripts/lib.sh; unset: no preloading, row-trigger).
#   1. FOR ALL TABLES (pg_fencing's own tables included): resource mode 'jobs' with mark 10 on
#      both; a publisher write with 12 arrives; a subscriber write with 11 is refused (FT001).
#      fencing_advance and a DELETE on the publisher raise the subscriber's mark too. Per-row
#      mode: a key deleted on the publisher with 25 (its row carried 20) cannot be re-inserted on
#      the subscriber with 21. The subscriber's own protections and marks are not disturbed.
#      A tombstone written before any publication reaches the subscriber with the initial copy.
#   2. FOR TABLE jobs, items (issue 30, case 1): pg_fencing's tables are added to the publication
#      by themselves, so a key the publisher inserted with 30 and deleted with 40 cannot be
#      re-created on the subscriber with 35. Tombstones and the tombstone floor from before the
#      subscription arrive with its initial copy, also on a subscriber that protects the table
#      only afterwards.
#   3. a publication without pg_fencing's tables (made with the event trigger off, as by a
#      publisher without the extension): fencing_protected_tables says so, and local writes on
#      the subscriber are refused with FT004 (they were accepted before issue 30).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
SUBDATA=""
cleanup() {
    if [ -n "$SUBDATA" ] && [ -f "$SUBDATA/postmaster.pid" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$SUBDATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    cleanup_all
}
trap cleanup EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_LOGICAL:-54439}
PUB=$PGPORT_TEST
SUB=$((PGPORT_TEST + 1))
PG_EXTRA_CONF="wal_level = logical" pg_start
SUBDATA="$WORK/sub"
mkdir -p "$SUBDATA" && chown postgres:postgres "$SUBDATA"
as_pg "$PGBIN/initdb" -D "$SUBDATA" -U postgres -A trust --no-sync >"$WORK/initdb-sub.log" 2>&1
cat >>"$SUBDATA/postgresql.conf" <<CONF
port = $SUB
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
fsync = off
wal_level = logical
$(shape_conf)
CONF
pg_ctl_start "$SUBDATA" "$WORK/sub.log" 60
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
pub() { "${PSQL[@]}" -p "$PUB" "$@"; }
sub() { "${PSQL[@]}" -p "$SUB" "$@"; }

write() {  # write <port> <db> <token> <sql>: the SQLSTATE of <sql> run with that token
    sqlstate_of "${PSQL[@]}" -p "$1" -d "$2" -c "BEGIN; SET LOCAL pg_fencing.token = '$3'; $4; COMMIT;"
}

SCHEMA="CREATE EXTENSION pg_fencing;
CREATE TABLE jobs (id int PRIMARY KEY, v bigint);
SELECT fencing_protect('jobs', 'jobs');
CREATE TABLE items (id int PRIMARY KEY, v bigint);
SELECT fencing_protect('items');
SELECT fencing_advance('jobs', 10);"
pub -o /dev/null -c "$SCHEMA"
# The subscriber's own protected table (first, so that its protection ids differ from the
# publisher's), with a mark of its own, which replication must not touch.
sub -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE local_only (id int PRIMARY KEY, v bigint);
SELECT fencing_protect('local_only', 'local');
SELECT fencing_advance('local', 500);
SQL
sub -o /dev/null -c "${SCHEMA#CREATE EXTENSION pg_fencing;}"
sub -o /dev/null -c "BEGIN; SET LOCAL pg_fencing.token = '7'; INSERT INTO items VALUES (99, 7); DELETE FROM items WHERE id = 99; COMMIT;"
local_ids=$(sub -Atc "SELECT string_agg(relid::text || '=' || id, ',' ORDER BY id) FROM _pg_fencing.protected_table")
expect_shape -p "$PUB" -d postgres
expect_shape -p "$SUB" -d postgres

echo "== 1. publication FOR ALL TABLES"
# A tombstone written before any publication (the feed was not published then): CREATE
# PUBLICATION puts it in the feed, and the initial copy brings it.
expect "publisher insert and delete of key 4 with 16, before any publication" ok \
    "$(write "$PUB" postgres 16 "INSERT INTO items VALUES (4, 15); DELETE FROM items WHERE id = 4")"
# ... and a bulk delete's, one tombstone run (src/state/tombstone_runs.rs) until the feed,
# which carries tombstones key by key, is filled. (Its keys, (1000) and up, are left out of the
# lists of short keys compared below.)
expect "publisher bulk delete of keys 1000..1099 with 16, before any publication" ok \
    "$(write "$PUB" postgres 16 "INSERT INTO items SELECT g, 16 FROM generate_series(1000, 1099) g; DELETE FROM items WHERE id >= 1000")"
expect "the bulk delete left a run" "1/100" "$(pub -Atc "SELECT count(*) || '/' || sum(key_count) FROM _pg_fencing.tombstone_run")"
expect "the unpublished feed holds nothing" 0 "$(pub -Atc "SELECT count(*) FROM _pg_fencing.tombstone_feed")"
pub -c "CREATE PUBLICATION everything FOR ALL TABLES"
expect "CREATE PUBLICATION filled the feed" "public.items (4) 16" \
    "$(pub -Atc "SELECT string_agg(relation || ' ' || key || ' ' || high_water, ',') FROM _pg_fencing.tombstone_feed WHERE key = '(4)'")"
expect "... with the run's keys (the run became rows)" "101/0" \
    "$(pub -Atc "SELECT (SELECT count(*) FROM _pg_fencing.tombstone_feed) || '/' || (SELECT count(*) FROM _pg_fencing.tombstone_run)")"
sub -c "CREATE SUBSCRIPTION everything CONNECTION 'host=127.0.0.1 port=$PUB dbname=postgres user=postgres' PUBLICATION everything"
wait_for "initial sync done" 0 "$SUB" postgres "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
wait_for "the tombstone of key 4 from before the subscription" 16 "$SUB" postgres \
    "SELECT t.high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'items'::regclass AND t.key = '(4)'"
expect "subscriber re-insert of key 4 with 15" FT001 "$(write "$SUB" postgres 15 "INSERT INTO items VALUES (4, 15)")"
expect "subscriber re-insert of bulk-deleted key 1050 with 15" FT001 "$(write "$SUB" postgres 15 "INSERT INTO items VALUES (1050, 15)")"
echo "-- per-row mode: a bulk delete while the feed is published (rows, key by key, as the feed needs)"
expect "publisher bulk delete of keys 2000..2099 with 30" ok \
    "$(write "$PUB" postgres 30 "INSERT INTO items SELECT g, 30 FROM generate_series(2000, 2099) g; DELETE FROM items WHERE id >= 2000")"
expect "no run on the publisher" 0 "$(pub -Atc "SELECT count(*) FROM _pg_fencing.tombstone_run")"
wait_for "the bulk delete's tombstones on the subscriber" 100 "$SUB" postgres \
    "SELECT count(*) FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'items'::regclass AND t.high_water = 30"
expect "subscriber re-insert of bulk-deleted key 2050 with 29" FT001 "$(write "$SUB" postgres 29 "INSERT INTO items VALUES (2050, 29)")"
expect "publisher re-insert of bulk-deleted key 2050 with 29" FT001 "$(write "$PUB" postgres 29 "INSERT INTO items VALUES (2050, 29)")"

echo "-- resource mode: a replicated write raises the subscriber's mark"
expect "publisher write with 12" ok "$(write "$PUB" postgres 12 "INSERT INTO jobs VALUES (1, 12)")"
wait_for "the row arrived" 12 "$SUB" postgres "SELECT fence_token FROM jobs WHERE id = 1"
expect "subscriber mark" 12 "$(sub -Atc "SELECT fencing_high_water('jobs')")"
expect "subscriber write with 11" FT001 "$(write "$SUB" postgres 11 "UPDATE jobs SET v = 11 WHERE id = 1")"
expect "fencing_protected_tables.active on the subscriber" "true|true|true" \
    "$(sub -Atc "SELECT string_agg(active::text, '|' ORDER BY relation::text) FROM fencing_protected_tables")"

echo "-- resource mode: fencing_advance and a DELETE on the publisher (no row carries their tokens)"
pub -Atc "SELECT fencing_advance('jobs', 40)" >/dev/null
wait_for "subscriber mark after the publisher's advance" 40 "$SUB" postgres "SELECT fencing_high_water('jobs')"
expect "publisher delete with 45" ok "$(write "$PUB" postgres 45 "DELETE FROM jobs WHERE id = 1")"
wait_for "subscriber mark after the publisher's delete" 45 "$SUB" postgres "SELECT fencing_high_water('jobs')"
expect "subscriber write with 44" FT001 "$(write "$SUB" postgres 44 "INSERT INTO jobs VALUES (2, 44)")"

echo "-- per-row mode: a key deleted on the publisher keeps its tombstone on the subscriber"
expect "publisher insert of key 5 with 20" ok "$(write "$PUB" postgres 20 "INSERT INTO items VALUES (5, 20)")"
wait_for "the row arrived" 20 "$SUB" postgres "SELECT fence_token FROM items WHERE id = 5"
expect "publisher delete of key 5 with 25" ok "$(write "$PUB" postgres 25 "DELETE FROM items WHERE id = 5")"
wait_for "the delete arrived" 0 "$SUB" postgres "SELECT count(*) FROM items WHERE id = 5"
wait_for "tombstone of key 5 on the subscriber" 25 "$SUB" postgres \
    "SELECT t.high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'items'::regclass AND t.key = '(5)'"
expect "subscriber re-insert of key 5 with 21" FT001 "$(write "$SUB" postgres 21 "INSERT INTO items VALUES (5, 21)")"
expect "subscriber re-insert of key 5 with 25" ok "$(write "$SUB" postgres 25 "INSERT INTO items VALUES (5, 25)")"
expect "publisher: its feed holds its tombstones" "(4) 16,(5) 25" \
    "$(pub -Atc "SELECT string_agg(key || ' ' || high_water, ',' ORDER BY key) FROM _pg_fencing.tombstone_feed WHERE length(key) < 6")"

echo "-- the subscriber's own state is untouched"
expect "subscriber protections (ids)" "$local_ids" \
    "$(sub -Atc "SELECT string_agg(relid::text || '=' || id, ',' ORDER BY id) FROM _pg_fencing.protected_table")"
expect "subscriber's own mark" 500 "$(sub -Atc "SELECT fencing_high_water('local')")"
expect "subscriber's own tombstone of key 99" 7 "$(sub -Atc "SELECT t.high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'items'::regclass AND t.key = '(99)'")"
expect "no replication worker failed (apply or table sync errors)" 0 \
    "$(grep -c 'logical replication .*worker.* exited with exit code' "$WORK/sub.log" || true)"
sub -c "DROP SUBSCRIPTION everything"

echo "== 2. publication FOR TABLE jobs, items: pg_fencing's tables come along by themselves (issue 30, case 1)"
# Before this subscription: a tombstone (key 11 at 55) and a tombstone floor (26, pruning none)
# on the publisher. The new subscriber gets both with its initial copy (issue 30: "including what
# existed before the subscription's initial copy").
expect "publisher insert and delete of key 11 with 55" ok "$(write "$PUB" postgres 55 "INSERT INTO items VALUES (11, 50); DELETE FROM items WHERE id = 11")"
pub -Atc "SELECT fencing_prune_tombstones('items', 26, 0)" >/dev/null
pub -c "CREATE PUBLICATION named FOR TABLE jobs, items"
expect "the publication carries pg_fencing's tables" "resource_high_water,tombstone_feed" \
    "$(pub -Atc "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = 'named' AND schemaname = '_pg_fencing'")"
pub -q -c "ALTER PUBLICATION named DROP TABLE _pg_fencing.tombstone_feed" 2>/dev/null
expect "dropping one of them while protected tables are published: added back" 2 \
    "$(pub -Atc "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'named' AND schemaname = '_pg_fencing'")"
sub -c "CREATE DATABASE partial"
"${PSQL[@]}" -p "$SUB" -d partial -o /dev/null -c "$SCHEMA"
"${PSQL[@]}" -p "$SUB" -d partial -c "CREATE SUBSCRIPTION named CONNECTION 'host=127.0.0.1 port=$PUB dbname=postgres user=postgres' PUBLICATION named"
wait_for "initial sync done" 0 "$SUB" partial "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
expect_shape -p "$SUB" -d partial
expect "fencing_protected_tables.active on the subscriber" "true|true" \
    "$("${PSQL[@]}" -p "$SUB" -d partial -Atc "SELECT string_agg(active::text, '|' ORDER BY relation::text) FROM fencing_protected_tables")"
wait_for "the tombstones from before the subscription" "(11) 55,(4) 16,(5) 25" "$SUB" partial \
    "SELECT string_agg(t.key || ' ' || t.high_water, ',' ORDER BY t.key) FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'items'::regclass AND length(t.key) < 6"
wait_for "the tombstone floor from before the subscription" 26 "$SUB" partial \
    "SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'items'::regclass"
expect "subscriber insert of key 11 with 54" FT001 "$(write "$SUB" partial 54 "INSERT INTO items VALUES (11, 54)")"
expect "subscriber insert of a new key with 25 (below the floor)" FT001 "$(write "$SUB" partial 25 "INSERT INTO items VALUES (12, 25)")"
expect "publisher insert of key 2 with 30" ok "$(write "$PUB" postgres 30 "INSERT INTO items VALUES (2, 30)")"
expect "publisher delete of key 2 with 40" ok "$(write "$PUB" postgres 40 "DELETE FROM items WHERE id = 2")"
wait_for "tombstone of key 2 on the subscriber" 40 "$SUB" partial \
    "SELECT t.high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'items'::regclass AND t.key = '(2)'"
expect "subscriber insert of key 2 with 35" FT001 "$(write "$SUB" partial 35 "INSERT INTO items VALUES (2, 35)")"
expect "publisher write with 60" ok "$(write "$PUB" postgres 60 "INSERT INTO jobs VALUES (3, 60)")"
wait_for "the row arrived" 60 "$SUB" partial "SELECT fence_token FROM jobs WHERE id = 3"
expect "subscriber write with 59" FT001 "$(write "$SUB" partial 59 "UPDATE jobs SET v = 59 WHERE id = 3")"
"${PSQL[@]}" -p "$SUB" -d partial -c "DROP SUBSCRIPTION named"
# A subscriber that protects the table only after its initial copy takes what the copy brought.
sub -c "CREATE DATABASE late"
"${PSQL[@]}" -p "$SUB" -d late -o /dev/null -c "CREATE EXTENSION pg_fencing" \
    -c "CREATE TABLE jobs (id int PRIMARY KEY, v bigint, fence_token bigint)" \
    -c "CREATE TABLE items (id int PRIMARY KEY, v bigint, fence_token bigint)"
"${PSQL[@]}" -p "$SUB" -d late -c "CREATE SUBSCRIPTION late CONNECTION 'host=127.0.0.1 port=$PUB dbname=postgres user=postgres' PUBLICATION named"
wait_for "initial sync done" 0 "$SUB" late "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
"${PSQL[@]}" -p "$SUB" -d late -c "ALTER SUBSCRIPTION late DISABLE"
# Its apply worker stops by itself (exit 0, not logged) once it sees the subscription disabled;
# dropped while still running, it would be terminated and logged as an exit with code 1, maybe
# after part 3 below has started counting such lines.
wait_for "the disabled subscription's worker stopped" 0 "$SUB" late \
    "SELECT count(pid) FROM pg_stat_subscription WHERE subname = 'late'"
"${PSQL[@]}" -p "$SUB" -d late -o /dev/null -c "SELECT fencing_protect('items')"
expect_shape -p "$SUB" -d late
expect "fencing_protect after the copy takes its tombstones and floor" "(11) 55,(2) 40,(4) 16,(5) 25 floor 26" \
    "$("${PSQL[@]}" -p "$SUB" -d late -Atc "SELECT string_agg(t.key || ' ' || t.high_water, ',' ORDER BY t.key) || ' floor ' || min(p.tombstone_floor) FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'items'::regclass AND length(t.key) < 6")"
"${PSQL[@]}" -p "$SUB" -d late -c "DROP SUBSCRIPTION late"

echo "== 3. a publication without pg_fencing's tables (a publisher without the extension's event trigger): the subscriber refuses local writes (FT004)"
log_start=$(wc -l <"$WORK/sub.log")  # the subscriptions dropped above ended their workers
pub -q -c "ALTER EVENT TRIGGER pg_fencing_publication DISABLE" -c "CREATE PUBLICATION bare FOR TABLE jobs, items" \
    -c "ALTER EVENT TRIGGER pg_fencing_publication ENABLE"
sub -c "CREATE DATABASE bare"
"${PSQL[@]}" -p "$SUB" -d bare -o /dev/null -c "$SCHEMA"
"${PSQL[@]}" -p "$SUB" -d bare -c "CREATE SUBSCRIPTION bare CONNECTION 'host=127.0.0.1 port=$PUB dbname=postgres user=postgres' PUBLICATION bare"
wait_for "initial sync done" 0 "$SUB" bare "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
wait_for "the rows arrived" 60 "$SUB" bare "SELECT max(fence_token) FROM jobs"
expect "publisher insert of key 7 with 70" ok "$(write "$PUB" postgres 70 "INSERT INTO items VALUES (7, 70)")"
expect "publisher delete of key 7 with 80" ok "$(write "$PUB" postgres 80 "DELETE FROM items WHERE id = 7")"
wait_for "the delete arrived" 0 "$SUB" bare "SELECT count(*) FROM items WHERE id = 7"
reason=$("${PSQL[@]}" -p "$SUB" -d bare -Atc "SELECT string_agg(active || ' ' || coalesce(inactive_reason, ''), ' / ' ORDER BY relation::text) FROM fencing_protected_tables")
case "$reason" in
    "false "*tombstone_feed*" / false "*resource_high_water*) echo "  ok: the view says both protections are incomplete: $reason" ;;
    *) echo "  FAIL: fencing_protected_tables should say that pg_fencing's tables are not subscribed: $reason"; fail=1 ;;
esac
# Before issue 30 the view said so, yet these writes were accepted (key 7's tombstone is at 70
# there, the publisher deleted it with 80).
expect "subscriber insert of key 7 with 75" FT004 "$(write "$SUB" bare 75 "INSERT INTO items VALUES (7, 75)")"
expect "subscriber write to jobs with 61" FT004 "$(write "$SUB" bare 61 "UPDATE jobs SET v = 61 WHERE id = 3")"
expect "subscriber fenced_insert" FT004 "$(sqlstate_of "${PSQL[@]}" -p "$SUB" -d bare -c "SELECT fenced_insert('items', '{\"id\": 8, \"v\": 1}', 90)")"
expect "no replication worker failed (apply or table sync errors)" 0 \
    "$(tail -n +"$((log_start + 1))" "$WORK/sub.log" | grep -c 'logical replication .*worker.* exited with exit code' || true)"
"${PSQL[@]}" -p "$SUB" -d bare -c "DROP SUBSCRIPTION bare"
exit $fail
