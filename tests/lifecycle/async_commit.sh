#!/usr/bin/env bash
# A raised mark with no data of its own is durable before the caller can rely on it, whatever
# synchronous_commit says (issue 14, path 4): with synchronous_commit = off, fencing_advance('r',
# 90) returns 90; an immediate crash right after must not bring the mark back, so a write with 85
# is still refused after the restart. Ordinary fenced writes under async commit may be lost on a
# crash, but only together with the mark they raised (checked last).
# A throwaway cluster on 127.0.0.1:${PGPORT_LIFECYCLE:-54409}; wal_writer_delay = 10s, so an
# unflushed commit stays unflushed until the crash (the WAL writer would otherwise flush it
# within 200 ms and hide the fault).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_LIFECYCLE:-54409}
PG_EXTRA_CONF="synchronous_commit = off
wal_writer_delay = '10s'
wal_writer_flush_after = 0
fsync = on" pg_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
crash_and_restart() {
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m immediate -w stop >/dev/null
    pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log" 60
}

"${PSQL[@]}" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE ledger (id int PRIMARY KEY, v int);
SELECT fencing_protect('ledger', 'r');
BEGIN; SET LOCAL pg_fencing.token = '80'; INSERT INTO ledger VALUES (1, 80); COMMIT;
CHECKPOINT;
SQL
expect "synchronous_commit" off "$("${PSQL[@]}" -Atc "SHOW synchronous_commit")"
# The first change after the checkpoint writes a full-page image, which fills WAL pages and wakes
# the WAL writer; take that one first, flush it, so the advance under test is a small record.
"${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '80'; UPDATE ledger SET v = 81 WHERE id = 1; COMMIT;"
"${PSQL[@]}" -Atc "SELECT pg_switch_wal()" >/dev/null

echo "== fencing_advance('r', 90) under synchronous_commit = off, then an immediate crash"
expect "fencing_advance returns" 90 "$("${PSQL[@]}" -Atc "SELECT fencing_advance('r', 90)")"
crash_and_restart
expect "mark after the crash" 90 "$("${PSQL[@]}" -Atc "SELECT fencing_high_water('r')")"
expect "an older holder's write after the crash" FT001 \
    "$(sqlstate_of "${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '85'; UPDATE ledger SET v = 85 WHERE id = 1; COMMIT;")"

echo "== the same inside a transaction block, and with SET LOCAL synchronous_commit = off"
expect "advance in a block" 95 "$("${PSQL[@]}" -Atc "BEGIN; SET LOCAL synchronous_commit = off; SELECT fencing_advance('r', 95); COMMIT;" | head -1)"
crash_and_restart
expect "mark after the crash" 95 "$("${PSQL[@]}" -Atc "SELECT fencing_high_water('r')")"

echo "== an advance that raises nothing still makes the mark it reports durable"
# A holder's own write with 100 commits asynchronously (not flushed); its advance with 100
# raises nothing, but it reports 100, so the mark must survive a crash from then on.
"${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '100'; UPDATE ledger SET v = 100 WHERE id = 1; COMMIT;"
expect "advance with the current mark" 100 "$("${PSQL[@]}" -Atc "SELECT fencing_advance('r', 100)")"
crash_and_restart
expect "mark after the crash" 100 "$("${PSQL[@]}" -Atc "SELECT fencing_high_water('r')")"
expect "row and mark survived together" "100|100" "$("${PSQL[@]}" -Atc "SELECT v || '|' || fence_token FROM ledger WHERE id = 1")"

echo "== advances between WAL records of every length never fail (WAL page boundaries)"
# 30,000 advances, each after an insert of a different length, so that some come exactly when
# the WAL ends on a page boundary (where a flush to the insert position would fail, XX000).
"${PSQL[@]}" -c "CREATE TABLE pad (id serial PRIMARY KEY, v text)"
expect "30,000 advances after inserts of varying length" ok "$(sqlstate_of "${PSQL[@]}" -c "DO \$\$ BEGIN
    FOR i IN 1..30000 LOOP
        INSERT INTO pad (v) VALUES (repeat('x', i % 97));
        PERFORM fencing_advance('r', 100);
    END LOOP; END \$\$;")"

echo "== ordinary fenced writes: the row and the mark it raised are kept or lost together"
"${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '110'; UPDATE ledger SET v = 110 WHERE id = 1; COMMIT;"
crash_and_restart
row=$("${PSQL[@]}" -Atc "SELECT fence_token || '|' || fencing_high_water('r') FROM ledger WHERE id = 1")
case "$row" in
    "110|110" | "100|100") echo "  ok: the token column and the mark agree after the crash ($row)" ;;
    *) echo "  FAIL: the token column and the mark disagree after the crash, or went below 100: $row"; fail=1 ;;
esac
exit $fail
