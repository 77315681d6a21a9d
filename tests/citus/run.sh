#!/usr/bin/env bash
# pg_fencing on a Citus cluster (issue 45; docs/citus.md): Citus 14.0.1 built and installed into
# PostgreSQL 18 (tests/citus/build.sh, which fails without a source of Citus), then a coordinator
# and two workers on 127.0.0.1:${PGPORT_CITUS:-54484} and the two ports above it, each preloading
# citus and pg_fencing, with both extensions in their database. Shown here (docs/citus.md):
#   - a hash-distributed table (4 shards on 2 workers) and a reference table protected in
#     resource mode: the marker on every shard; writes without a token FT002; every write path
#     through the coordinator (router and multi-shard INSERT/UPDATE/DELETE, INSERT … SELECT
#     repartitioned, routed and pushed down, ON CONFLICT, a generic plan, COPY, TRUNCATE) admitted for the holder, stamped with its token,
#     and refused (FT001) for a stale holder also on shards the newer holder never wrote, after
#     fencing_advance too; an aborted distributed transaction raises no mark; MERGE and a COPY
#     that gives the token column values refused (0A000);
#   - writes entering at a worker, aimed at a shard directly, or sent by run_command_on_shards
#     refused (FT004); the marker cannot be dropped (55000); a moved shard keeps it and the
#     fence, as do shards drained off a worker that is removed, added back and rebalanced; a
#     node without pg_fencing preloaded cannot be added (55000); PostgreSQL leases'
#     time fence (FT003); fencing_unprotect clears every node;
#   - every other kind of Citus table (Citus local, distributed partitioned) and per-row mode
#     refused (0A000) with nothing left on any node; a protected table distributed afterwards
#     (create_distributed_table, create_reference_table), re-created (alter_distributed_table)
#     or taken back (undistribute_table) keeps its protection and the resource's mark, per-row
#     mode and create_distributed_table_concurrently refused (0A000); a table taken back with
#     undistribute_table can be protected;
#   - the bypass hunter's contract (tests/citus/hunt.py, CITUS_HUNT_SEEDS="1 2",
#     CITUS_HUNT_STEPS=150): random writes of every path and token class between shard moves,
#     each outcome against a model of docs/citus.md, no refused value ever visible, marks equal;
#   - etcd locks from the coordinator's background worker (tests/citus/etcd.py, etcd on
#     127.0.0.1:${ETCD_CITUS_PORT:-24390}): fencing_acquire's token fences the distributed table, a
#     later `etcdctl lock` holder's revision refuses it (FT001), a revoked lease FT003;
#   - and what docs/citus.md reports of Citus for the design: a stable SET expression reaches the
#     shard as its value, volatile UPDATE functions and non-immutable RETURNING are refused.
#
#   tests/citus/run.sh          (KEEP_WORK=1 keeps the clusters' directories and logs)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
PGBIN=$PG18_BIN

tests/citus/build.sh

source tests/citus/cluster.sh
start_citus_cluster "${PGPORT_CITUS:-54484}"
C=(-h 127.0.0.1 -p "$BASE" -U postgres)
PSQL=("$PGBIN/psql" -X -q -v ON_ERROR_STOP=1)
q() { "${PSQL[@]}" "${C[@]}" -Atc "$1"; }
qon() { "${PSQL[@]}" -h 127.0.0.1 -p "$1" -U postgres -Atc "$2"; }
state() { sqlstate_of "${PSQL[@]}" "${C[@]}" -c "$1"; }
write() { state "BEGIN; SET LOCAL pg_fencing.token = '$1'; $2; COMMIT;"; }
expect "the cluster: Citus $(q "SELECT extversion FROM pg_extension WHERE extname = 'citus'") with two active workers" \
    2 "$(q "SELECT count(*) FROM pg_dist_node WHERE isactive AND noderole = 'primary' AND nodeport <> $BASE")"

# Nothing of a refused fencing_protect is left on any node: no trigger of ours, no protection.
nothing_left() {  # nothing_left <table>
    local n port
    for n in 0 1 2; do
        port=$((BASE + n))
        expect "node :$port: no trigger of pg_fencing on $1 or its shards" 0 \
            "$(qon "$port" "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'zz_pg_fencing%' AND tgrelid::regclass::text LIKE '$1%'")"
        expect "node :$port: no protection of $1 or its shards" 0 \
            "$(qon "$port" "SELECT count(*) FROM _pg_fencing.protected_table WHERE relid::regclass::text LIKE '$1%'")"
    done
}

# --- A hash-distributed table in resource mode (docs/citus.md, "How a distributed table is fenced").
q "CREATE TABLE ledger (account int PRIMARY KEY, v int)"
q "SELECT create_distributed_table('ledger', 'account', shard_count => 4)" >/dev/null
expect "fencing_protect of a hash-distributed table (per-row mode) is refused" 0A000 "$(state "SELECT fencing_protect('ledger')")"
nothing_left ledger
expect "fencing_protect of a hash-distributed table (resource mode)" ok "$(state "SELECT fencing_protect('ledger', 'settlement')")"
expect "its shape" citus "$(q "SELECT shape FROM fencing_protected_tables WHERE relation = 'ledger'::regclass")"
expect "the protection is active" t "$(q "SELECT active FROM fencing_protected_tables WHERE relation = 'ledger'::regclass")"
markers() {  # markers <port> <table>: marker constraints on the table's shards held on that node
    qon "$1" "SET citus.override_table_visibility = off; SELECT count(*) FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid
              WHERE c.conname LIKE 'zz\_pg\_fencing\_citus\_%' AND r.relname ~ '^$2_[0-9]+$'"
}
shards_on() {  # shards_on <port> <table>
    q "SELECT count(*) FROM citus_shards WHERE table_name = '$2'::regclass AND nodeport = $1"
}
for n in 1 2; do
    port=$((BASE + n))
    expect "worker :$port: every shard of ledger there carries the marker" "$(shards_on "$port" ledger)" "$(markers "$port" ledger)"
done
expect "a write without a token" FT002 "$(state "INSERT INTO ledger VALUES (100, 1)")"
expect "holder 10: a multi-row INSERT across every shard" ok \
    "$(write 10 "INSERT INTO ledger SELECT g, 0 FROM generate_series(1, 40) g")"
expect "holder 10: a router UPDATE" ok "$(write 10 "UPDATE ledger SET v = v + 1 WHERE account = 1")"
expect "holder 10: a multi-shard UPDATE" ok "$(write 10 "UPDATE ledger SET v = v + 1")"
expect "holder 10: a router DELETE" ok "$(write 10 "DELETE FROM ledger WHERE account = 40")"
expect "every row stamped with 10" "39|10|10" "$(q "SELECT count(*), min(fence_token), max(fence_token) FROM ledger")"
expect "an INSERT that names the token column gets the writer's token" ok \
    "$(write 10 "INSERT INTO ledger (account, v, fence_token) VALUES (41, 0, 1)")"
expect "… stamped 10, not 1" 10 "$(q "SELECT fence_token FROM ledger WHERE account = 41")"
expect "an UPDATE that sets the token column gets the writer's token" ok \
    "$(write 10 "UPDATE ledger SET fence_token = 2 WHERE account = 41")"
expect "… stamped 10, not 2" 10 "$(q "SELECT fence_token FROM ledger WHERE account = 41")"
# Holder 20 writes one row, on one shard; a stale holder is refused on every shard, on every path.
expect "holder 20 writes account 1 only" ok "$(write 20 "UPDATE ledger SET v = 100 WHERE account = 1")"
expect "the resource's mark" 20 "$(q "SELECT fencing_high_water('settlement')")"
other=$(q "SELECT account FROM ledger WHERE get_shard_id_for_distribution_column('ledger', account)
           <> get_shard_id_for_distribution_column('ledger', 1)
           AND (SELECT nodeport FROM citus_shards s WHERE s.shardid = get_shard_id_for_distribution_column('ledger', account))
           <> (SELECT nodeport FROM citus_shards s WHERE s.shardid = get_shard_id_for_distribution_column('ledger', 1))
           ORDER BY account LIMIT 1")
expect "a row on a shard of another node than account 1's" t "$([ -n "$other" ] && echo t || echo f)"
expect "stale 10: a router UPDATE of a row holder 20 never wrote (another node)" FT001 "$(write 10 "UPDATE ledger SET v = -1 WHERE account = $other")"
expect "stale 10: a router DELETE there" FT001 "$(write 10 "DELETE FROM ledger WHERE account = $other")"
expect "stale 10: an INSERT there" FT001 "$(write 10 "INSERT INTO ledger VALUES (1000 + $other, -1)")"
expect "stale 10: a multi-shard UPDATE" FT001 "$(write 10 "UPDATE ledger SET v = -1")"
expect "stale 10: a multi-shard DELETE" FT001 "$(write 10 "DELETE FROM ledger WHERE v >= 0")"
expect "stale 10: a DELETE matching no row" FT001 "$(write 10 "DELETE FROM ledger WHERE account = -5")"
# INSERT … SELECT: its stamp is a subquery Citus runs on the coordinator (docs/citus.md).
expect "stale 10: INSERT … SELECT whose rows Citus repartitions" FT001 "$(write 10 "INSERT INTO ledger SELECT account + 500, -1 FROM ledger")"
expect "stale 10: INSERT … SELECT of one shard's rows (a router SELECT)" FT001 "$(write 10 "INSERT INTO ledger SELECT account + 500, -1 FROM ledger WHERE account = $other")"
expect "stale 10: INSERT … SELECT of colocated rows (pushed down)" FT001 "$(write 10 "INSERT INTO ledger SELECT account, -1 FROM ledger ON CONFLICT DO NOTHING")"
# (Citus plans an INSERT … SELECT with parameters for each execution: it has no generic plan.)
expect "stale 10: a prepared INSERT … SELECT, after six executions by holder 20" FT001 \
    "$(state "PREPARE i(int) AS INSERT INTO ledger SELECT account + \$1, v FROM ledger WHERE account = $other; BEGIN; SET LOCAL pg_fencing.token = '20'; EXECUTE i(600); EXECUTE i(601); EXECUTE i(602); EXECUTE i(603); EXECUTE i(604); EXECUTE i(605); COMMIT; BEGIN; SET LOCAL pg_fencing.token = '10'; EXECUTE i(606); COMMIT")"
expect "holder 20: INSERT … SELECT, repartitioned and routed" ok \
    "$(write 20 "INSERT INTO ledger SELECT account + 500, v FROM ledger WHERE account <= 40; INSERT INTO ledger SELECT account + 700, v FROM ledger WHERE account = $other")"
expect "… its rows stamped with 20" "true 20 20" "$(q "SELECT (count(*) > 6) || ' ' || min(fence_token) || ' ' || max(fence_token) FROM ledger WHERE account > 500")"
expect "INSERT … SELECT DISTINCT (rows and stamp computed on the workers) is refused" FT004 \
    "$(write 20 "INSERT INTO ledger SELECT DISTINCT account + 800, v FROM ledger")"
expect "holder 20 removes them" ok "$(write 20 "DELETE FROM ledger WHERE account > 500")"
expect "stale 10: INSERT … ON CONFLICT DO UPDATE" FT001 "$(write 10 "INSERT INTO ledger VALUES ($other, -1) ON CONFLICT (account) DO UPDATE SET v = -1")"
expect "stale 10: a prepared UPDATE (generic plan)" FT001 \
    "$(state "SET plan_cache_mode = force_generic_plan; PREPARE u(int) AS UPDATE ledger SET v = -1 WHERE account = \$1; BEGIN; SET LOCAL pg_fencing.token = '20'; EXECUTE u($other); COMMIT; BEGIN; SET LOCAL pg_fencing.token = '10'; EXECUTE u($other); COMMIT")"
expect "stale 10: an UPDATE in a WITH query" FT001 "$(write 10 "WITH x AS (UPDATE ledger SET v = -1 WHERE account = $other RETURNING account) SELECT count(*) FROM x")"
expect "stale 10: a DELETE in a WITH query" FT001 "$(write 10 "WITH x AS (DELETE FROM ledger WHERE account = $other RETURNING account) SELECT count(*) FROM x")"
expect "stale 10: an UPDATE joined with another distributed table" FT001 "$(write 10 "UPDATE ledger l SET v = -1 FROM ledger o WHERE l.account = o.account AND o.account = $other")"
expect "an UPDATE through a view (refused by Citus)" 0A000 "$(q "CREATE VIEW ledger_view AS SELECT * FROM ledger" && write 10 "UPDATE ledger_view SET v = -1 WHERE account = $other")"
expect "fenced_update (refused: Citus allows no non-immutable function in its RETURNING list)" 0A000 "$(state "SELECT fenced_update('ledger', '{\"account\": $other}', '{\"v\": -1}', 10)")"
expect "stale 10: TRUNCATE" FT001 "$(write 10 "TRUNCATE ledger")"
expect "stale 10: COPY" FT001 "$(printf '%s\n' "$((2000 + other))	-1" | sqlstate_of "${PSQL[@]}" "${C[@]}" -c "BEGIN" -c "SET LOCAL pg_fencing.token = '10'" -c "COPY ledger (account, v) FROM STDIN" -c "COMMIT")"
expect "holder 20: COPY (without the token column)" ok "$(printf '%s\n' "3001	1" "3002	1" | sqlstate_of "${PSQL[@]}" "${C[@]}" -c "BEGIN" -c "SET LOCAL pg_fencing.token = '20'" -c "COPY ledger (account, v) FROM STDIN" -c "COMMIT")"
expect "… stamped 20" "2|20" "$(q "SELECT count(*), min(fence_token) FROM ledger WHERE account IN (3001, 3002)")"
expect "a COPY that gives the token column values is refused" 0A000 "$(printf '%s\n' "3003	1	20" | sqlstate_of "${PSQL[@]}" "${C[@]}" -c "BEGIN" -c "SET LOCAL pg_fencing.token = '20'" -c "COPY ledger FROM STDIN" -c "COMMIT")"
expect "MERGE is refused" 0A000 "$(write 20 "MERGE INTO ledger l USING (SELECT 1 AS a) s ON l.account = s.a WHEN MATCHED THEN UPDATE SET v = 5")"
expect "fencing_advance to 30" 30 "$(q "SELECT fencing_advance('settlement', 30)")"
expect "stale 20 after the advance, on a shard 30 never wrote" FT001 "$(write 20 "UPDATE ledger SET v = -1 WHERE account = $other")"
expect "an aborted distributed transaction of 40" ok "$(state "BEGIN; SET LOCAL pg_fencing.token = '40'; UPDATE ledger SET v = v + 1; ROLLBACK")"
expect "… left the mark at 30" 30 "$(q "SELECT fencing_high_water('settlement')")"
expect "holder 30: an UPDATE in a WITH query" ok "$(write 30 "WITH x AS (UPDATE ledger SET v = v + 1 WHERE account = $other RETURNING account) SELECT count(*) FROM x")"
expect "holder 30: a multi-shard UPDATE in a two-phase commit" ok "$(write 30 "UPDATE ledger SET v = v + 1")"
expect "every row stamped with 30" "30|30" "$(q "SELECT min(fence_token), max(fence_token) FROM ledger")"
expect "no stale value was written (v = -1)" 0 "$(q "SELECT count(*) FROM ledger WHERE v = -1")"
# Writes that enter at a worker, or are aimed at a shard directly, are not checked there: refused.
W1=$((BASE + 1))
shard1=$(qon "$W1" "SET citus.override_table_visibility = off; SELECT relname FROM pg_class WHERE relname ~ '^ledger_[0-9]+$' ORDER BY relname LIMIT 1")
wstate() { sqlstate_of "${PSQL[@]}" -h 127.0.0.1 -p "$W1" -U postgres -c "BEGIN; SET LOCAL pg_fencing.token = '99'; $1; COMMIT;"; }
expect "a write entering at a worker" FT004 "$(wstate "UPDATE ledger SET v = -1 WHERE account = $other")"
expect "an INSERT entering at a worker" FT004 "$(wstate "INSERT INTO ledger VALUES (5000, -1)")"
expect "an UPDATE aimed at a shard on its worker" FT004 "$(wstate "UPDATE $shard1 SET v = -1")"
expect "a DELETE aimed at a shard on its worker" FT004 "$(wstate "DELETE FROM $shard1")"
expect "an INSERT aimed at a shard on its worker" FT004 "$(wstate "INSERT INTO $shard1 VALUES (6000, -1, 99)")"
expect "a COPY aimed at a shard on its worker" FT004 "$(printf '%s\n' "6001	-1	99" | sqlstate_of "${PSQL[@]}" -h 127.0.0.1 -p "$W1" -U postgres -c "COPY $shard1 FROM STDIN")"
expect "run_command_on_shards from the coordinator (a user's command on the shards): refused on every shard" "0|4" \
    "$(q "SELECT count(*) FILTER (WHERE success), count(*) FILTER (WHERE result LIKE '%is not active%') FROM run_command_on_shards('ledger', 'UPDATE %s SET v = -1')")"
expect "no stale value was written (v = -1)" 0 "$(q "SELECT count(*) FROM ledger WHERE v = -1")"
# Code that runs inside a statement Citus sent from the coordinator is not that statement: a
# function pushed down to the workers, a distributed function, a foreign key's action (outside
# check, issue 45; each admitted no token before).
q "CREATE TABLE other (id int PRIMARY KEY, v int)"
q "SELECT create_distributed_table('other', 'id', shard_count => 4)" >/dev/null
q "INSERT INTO other SELECT g, g FROM generate_series(1, 20) g"
q "CREATE FUNCTION hit_shards(int) RETURNS int LANGUAGE plpgsql AS \$f\$
DECLARE r regclass; n int := 0; k int;
BEGIN
  FOR r IN SELECT to_regclass('public.ledger_' || s.shardid) FROM pg_dist_shard s WHERE s.logicalrelid = 'ledger'::regclass LOOP
    IF r IS NOT NULL THEN EXECUTE format('UPDATE %s SET v = -1, fence_token = 1', r); GET DIAGNOSTICS k = ROW_COUNT; n := n + k; END IF;
  END LOOP;
  RETURN n;
END \$f\$"
expect "a function pushed down to the workers (a SELECT of another table) that writes shards" FT004 \
    "$(state "SELECT id, hit_shards(id) FROM other WHERE id IN (1, 2)")"
q "SELECT create_distributed_function('hit_shards(int)', '\$1', colocate_with := 'other')" >/dev/null
expect "a distributed function, delegated to a worker, that writes shards" FT004 "$(state "SELECT hit_shards(3)")"
expect "no row written by them" 0 "$(q "SELECT count(*) FROM ledger WHERE v = -1")"
q "CREATE TABLE kinds2 (id int PRIMARY KEY)"
q "SELECT create_reference_table('kinds2')" >/dev/null
q "INSERT INTO kinds2 SELECT generate_series(1, 5)"
q "CREATE TABLE led2 (account int PRIMARY KEY, kind int REFERENCES kinds2 (id) ON DELETE CASCADE ON UPDATE CASCADE, v int)"
q "SELECT create_distributed_table('led2', 'account', shard_count => 4)" >/dev/null
q "SELECT fencing_protect('led2', 'led2')" >/dev/null
expect "holder 10 fills the table with a cascading foreign key" ok "$(write 10 "INSERT INTO led2 SELECT g, g % 5 + 1, 0 FROM generate_series(1, 20) g")"
expect "a DELETE of a referenced row whose cascade would delete protected rows" FT004 "$(state "DELETE FROM kinds2 WHERE id = 1")"
expect "an UPDATE of a referenced key whose cascade would change protected rows" FT004 "$(state "UPDATE kinds2 SET id = 50 WHERE id = 2")"
expect "TRUNCATE … CASCADE of the referenced table without a token" FT002 "$(state "TRUNCATE kinds2 CASCADE")"
q "SELECT fencing_advance('led2', 20)" >/dev/null
expect "TRUNCATE … CASCADE of the referenced table with a stale token" FT001 "$(write 10 "TRUNCATE kinds2 CASCADE")"
expect "the protected rows are all there" 20 "$(q "SELECT count(*) FROM led2")"
expect "a protected table attached as a partition (writes through the parent would not be checked)" 0A000 \
    "$(q "CREATE TABLE led_parent (account int, kind int, v int, fence_token bigint, PRIMARY KEY (account)) PARTITION BY RANGE (account)" && state "ALTER TABLE led_parent ATTACH PARTITION led2 FOR VALUES FROM (0) TO (1000)")"
expect "run_command_on_shards dropping the marker of every shard is refused" "0|4" \
    "$(q "SELECT count(*) FILTER (WHERE success), count(*) FILTER (WHERE result LIKE '%marks a table protected%') FROM run_command_on_shards('led2', \$c\$DO \$x\$ BEGIN EXECUTE (SELECT format('ALTER TABLE %1\$s DROP CONSTRAINT %%I', conname) FROM pg_constraint WHERE conrelid = '%1\$s'::regclass AND conname LIKE 'zz%%'); END \$x\$\$c\$)")"
expect "a changed default of the token column makes the protection inactive" "f|FT004" \
    "$(q "ALTER TABLE led2 ALTER COLUMN fence_token SET DEFAULT 1" && q "SELECT active FROM fencing_protected_tables WHERE relation = 'led2'::regclass")|$(write 20 "UPDATE led2 SET v = 1 WHERE account = 1")"
expect "fencing_protect repairs it" "ok|t" "$(state "SELECT fencing_protect('led2', 'led2')")|$(q "SELECT active FROM fencing_protected_tables WHERE relation = 'led2'::regclass")"
expect "holder 20: INSERT … ON CONFLICT DO UPDATE that sets the token column is stamped with 20" ok \
    "$(write 20 "INSERT INTO led2 VALUES (1, 1, 5) ON CONFLICT (account) DO UPDATE SET v = 5, fence_token = 3")"
expect "… the row carries 20" 20 "$(q "SELECT fence_token FROM led2 WHERE account = 1")"
expect "EXPLAIN (without ANALYZE) of an UPDATE with a higher token" ok "$(write 99 "EXPLAIN UPDATE led2 SET v = 1 WHERE account = 1")"
expect "… raised no mark" 20 "$(q "SELECT fencing_high_water('led2')")"
# The marker is the table's, on every node, while the protection stands.
expect "ALTER TABLE … DROP CONSTRAINT of the marker" 55000 \
    "$(state "ALTER TABLE ledger DROP CONSTRAINT $(q "SELECT conname FROM pg_constraint WHERE conrelid = 'ledger'::regclass AND conname LIKE 'zz%'")")"
# A shard moved to the other worker keeps the marker; the fence holds on it.
moved=$(q "SELECT get_shard_id_for_distribution_column('ledger', $other)")
from=$(q "SELECT nodeport FROM citus_shards WHERE shardid = $moved")
to=$(( from == BASE + 1 ? BASE + 2 : BASE + 1 ))
expect "citus_move_shard_placement of account $other's shard" ok \
    "$(state "SELECT citus_move_shard_placement($moved, '127.0.0.1', $from, '127.0.0.1', $to, shard_transfer_mode => 'block_writes')")"
expect "… the moved shard carries the marker" 1 "$(qon "$to" "SET citus.override_table_visibility = off; SELECT count(*) FROM pg_constraint WHERE conrelid = 'ledger_$moved'::regclass AND conname LIKE 'zz\_pg\_fencing\_citus\_%'")"
q "CALL citus_cleanup_orphaned_resources()" >/dev/null
expect "stale 20 on the moved shard" FT001 "$(write 20 "UPDATE ledger SET v = -1 WHERE account = $other")"
expect "holder 30 on the moved shard" ok "$(write 30 "UPDATE ledger SET v = v + 1 WHERE account = $other")"
expect "a write aimed at the moved shard on its new worker" FT004 \
    "$(sqlstate_of "${PSQL[@]}" -h 127.0.0.1 -p "$to" -U postgres -c "UPDATE ledger_$moved SET v = -1")"
# A shard split in two, its halves on both workers: each half carries the marker; the fence holds.
split=$(q "SELECT get_shard_id_for_distribution_column('ledger', 1)")
range=$(q "SELECT shardminvalue || ' AND ' || shardmaxvalue FROM pg_dist_shard WHERE shardid = $split")
mid=$(q "SELECT ((shardminvalue::bigint + shardmaxvalue::bigint) / 2)::int FROM pg_dist_shard WHERE shardid = $split")
expect "citus_split_shard_by_split_points of account 1's shard" ok \
    "$(state "SELECT citus_split_shard_by_split_points($split, ARRAY['$mid'], ARRAY[(SELECT nodeid FROM pg_dist_node WHERE nodeport = $((BASE + 1))), (SELECT nodeid FROM pg_dist_node WHERE nodeport = $((BASE + 2)))], shard_transfer_mode => 'block_writes')")"
q "CALL citus_cleanup_orphaned_resources()" >/dev/null
for n in 1 2; do
    expect "worker :$((BASE + n)): every shard of ledger there carries the marker after the split" "$(shards_on $((BASE + n)) ledger)" "$(markers $((BASE + n)) ledger)"
done
expect "stale 20 on each half of the split shard" "FT001|FT001" \
    "$(write 20 "UPDATE ledger SET v = -1 WHERE account = 1")|$(write 20 "UPDATE ledger SET v = -1 WHERE account = $(q "SELECT min(account) FROM ledger WHERE worker_hash(account) BETWEEN $range AND get_shard_id_for_distribution_column('ledger', account) <> get_shard_id_for_distribution_column('ledger', 1)")")"
expect "holder 30 across the split shards" ok "$(write 30 "UPDATE ledger SET v = v + 1")"
# A worker down: writes that need it fail (never pass unchecked), and raise no mark.
on_worker() {  # on_worker <port>: the lowest account whose shard is on that worker
    q "SELECT min(account) FROM ledger l WHERE (SELECT nodeport FROM citus_shards s WHERE s.shardid = get_shard_id_for_distribution_column('ledger', l.account)) = $1"
}
down=$(on_worker $((BASE + 2)))
up=$(on_worker $((BASE + 1)))
as_pg "$PGBIN/pg_ctl" -D "$WORK/worker2" -m immediate -w stop >/dev/null
expect "a write of a row on the stopped worker fails" t "$(r=$(write 30 "UPDATE ledger SET v = v + 1 WHERE account = $down"); [ "$r" != ok ] && echo t || echo "$r")"
expect "a multi-shard UPDATE fails" t "$(r=$(write 30 "UPDATE ledger SET v = v + 1"); [ "$r" != ok ] && echo t || echo "$r")"
expect "a failed write with a higher token (50)" t "$(r=$(write 50 "UPDATE ledger SET v = v + 1 WHERE account = $down"); [ "$r" != ok ] && echo t || echo "$r")"
expect "… raised no mark" 30 "$(q "SELECT fencing_high_water('settlement')")"
expect "stale 20 on the worker still up" FT001 "$(write 20 "UPDATE ledger SET v = -1 WHERE account = $up")"
expect "holder 30 on the worker still up" ok "$(write 30 "UPDATE ledger SET v = v + 1 WHERE account = $up")"
pg_ctl_start "$WORK/worker2" "$WORK/worker2.log"
expect "the worker back: holder 30 writes its row" ok "$(write 30 "UPDATE ledger SET v = v + 1 WHERE account = $down")"
expect "… and a stale 20 is refused there" FT001 "$(write 20 "UPDATE ledger SET v = -1 WHERE account = $down")"
# A node added while a table is protected in the Citus shape must preload pg_fencing
# (docs/citus.md, "Adding a node"): one that does not is refused (55000), the addition rolled back.
start_citus_node worker3 $((BASE + 3)) citus
NODES="$NODES worker3"
expect "citus_add_node of a node without pg_fencing preloaded" 55000 "$(state "SELECT citus_add_node('127.0.0.1', $((BASE + 3)))")"
expect "… was rolled back" 0 "$(q "SELECT count(*) FROM pg_dist_node WHERE nodeport = $((BASE + 3))")"
expect "citus_update_node pointing a worker at it" 55000 \
    "$(state "SELECT citus_update_node((SELECT nodeid FROM pg_dist_node WHERE nodeport = $((BASE + 2))), '127.0.0.1', $((BASE + 3)))")"
expect "… was rolled back" 1 "$(q "SELECT count(*) FROM pg_dist_node WHERE nodeport = $((BASE + 2))")"
expect "citus_add_node inside an expression" 55000 "$(state "SELECT citus_add_node('127.0.0.1', $((BASE + 3))) + 0")"
expect "master_update_node pointing a worker at it" 55000 \
    "$(state "SELECT master_update_node((SELECT nodeid FROM pg_dist_node WHERE nodeport = $((BASE + 2))), '127.0.0.1', $((BASE + 3)))")"
expect "citus_add_node in a PL/pgSQL block" 55000 \
    "$(state "DO \$\$ BEGIN PERFORM coalesce(citus_add_node('127.0.0.1', $((BASE + 3))), 0); END \$\$")"
expect "an inactive node added, then activated" 55000 \
    "$(state "SELECT citus_add_inactive_node('127.0.0.1', $((BASE + 3))); SELECT citus_activate_node('127.0.0.1', $((BASE + 3)))::text")"
expect "… none of them joined" 0 "$(q "SELECT count(*) FROM pg_dist_node WHERE nodeport = $((BASE + 3))")"
as_pg "$PGBIN/pg_ctl" -D "$WORK/worker3" -m immediate -w stop >/dev/null
# A worker drained and removed, then added back and rebalanced: the shards keep their marker and
# the fence wherever they go.
expect "citus_drain_node of a worker" ok \
    "$(state "SELECT citus_drain_node('127.0.0.1', $((BASE + 2)), shard_transfer_mode => 'block_writes')")"
q "CALL citus_cleanup_orphaned_resources()" >/dev/null
expect "citus_remove_node of it" ok "$(state "SELECT citus_remove_node('127.0.0.1', $((BASE + 2)))")"
expect "every shard of ledger on the other worker carries the marker" "$(q "SELECT count(*) FROM citus_shards WHERE table_name = 'ledger'::regclass")" "$(markers $((BASE + 1)) ledger)"
expect "stale 20 after the removal" FT001 "$(write 20 "UPDATE ledger SET v = -1")"
expect "holder 30 after the removal" ok "$(write 30 "UPDATE ledger SET v = v + 1")"
expect "citus_add_node of it again (it preloads pg_fencing)" ok "$(state "SELECT citus_add_node('127.0.0.1', $((BASE + 2)))")"
expect "rebalance_table_shards" ok "$(state "SELECT rebalance_table_shards(shard_transfer_mode => 'block_writes')")"
q "CALL citus_cleanup_orphaned_resources()" >/dev/null
for n in 1 2; do
    expect "worker :$((BASE + n)): every shard of ledger there carries the marker after the rebalance" "$(shards_on $((BASE + n)) ledger)" "$(markers $((BASE + n)) ledger)"
done
expect "shards on the added worker" t "$([ "$(shards_on $((BASE + 2)) ledger)" -gt 0 ] && echo t || echo f)"
expect "stale 20 after the rebalance" FT001 "$(write 20 "UPDATE ledger SET v = -1")"
expect "holder 30 after the rebalance" ok "$(write 30 "UPDATE ledger SET v = v + 1")"
expect "no stale value in ledger" 0 "$(q "SELECT count(*) FROM ledger WHERE v = -1")"
# PostgreSQL leases taken on the coordinator: the time fence.
lease=$(q "SELECT fencing_lease_acquire('settlement-lease', '1 minute')")
expect "fencing_advance to the lease's token" "$lease" "$(q "SELECT fencing_advance('settlement', $lease)")"
expect "a write with the live lease's token" ok "$(write "$lease" "UPDATE ledger SET v = v + 1 WHERE account = 1")"
q "SELECT fencing_lease_release($lease)" >/dev/null
expect "a write with the released lease's token" FT003 "$(write "$lease" "UPDATE ledger SET v = v + 1 WHERE account = 1")"
# fencing_unprotect takes the marker and the default off every node.
expect "fencing_unprotect" ok "$(state "SELECT fencing_unprotect('ledger')")"
for n in 1 2; do
    expect "worker :$((BASE + n)): no marker left" 0 "$(markers $((BASE + n)) ledger)"
done
expect "no default left" 0 "$(q "SELECT count(*) FROM pg_attrdef WHERE adrelid = 'ledger'::regclass")"
expect "a write without a token after fencing_unprotect" ok "$(state "UPDATE ledger SET v = 0 WHERE account = 1")"
expect "protected again (the resource's mark stays)" ok "$(state "SELECT fencing_protect('ledger', 'settlement')")"
expect "stale 20 again" FT001 "$(write 20 "UPDATE ledger SET v = -1 WHERE account = 1")"

# --- A reference table (a placement on every node, the coordinator's included).
q "CREATE TABLE codes (id int PRIMARY KEY, v int)"
q "SELECT create_reference_table('codes')" >/dev/null
expect "fencing_protect of a reference table" ok "$(state "SELECT fencing_protect('codes', 'codes')")"
expect "holder 5 writes the reference table" ok "$(write 5 "INSERT INTO codes VALUES (1, 1), (2, 2)")"
expect "holder 6" ok "$(write 6 "UPDATE codes SET v = 3 WHERE id = 1")"
expect "stale 5" FT001 "$(write 5 "UPDATE codes SET v = -1 WHERE id = 2")"
cplace=$(q "SET citus.override_table_visibility = off; SELECT relname FROM pg_class WHERE relname ~ '^codes_[0-9]+$' LIMIT 1")
expect "stale 5 aimed at the coordinator's own placement" FT001 "$(write 5 "UPDATE $cplace SET v = -1")"
expect "a write to the reference table entering at a worker" FT004 "$(wstate "UPDATE codes SET v = -1")"
expect "no stale value in the reference table" 0 "$(q "SELECT count(*) FROM codes WHERE v = -1")"
q "CREATE TABLE local_meta (id int PRIMARY KEY, v int)"
q "SELECT citus_add_local_table_to_metadata('local_meta')" >/dev/null
expect "fencing_protect of a Citus local table" 0A000 "$(state "SELECT fencing_protect('local_meta')")"
nothing_left local_meta
q "CREATE TABLE events (id int, at date, v int, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)"
q "CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')"
q "SELECT create_distributed_table('events', 'id')" >/dev/null
expect "fencing_protect of a distributed partitioned table" 0A000 "$(state "SELECT fencing_protect('events')")"
expect "fencing_protect of a partition of a distributed table" 0A000 "$(state "SELECT fencing_protect('events_2026')")"
nothing_left events

# A table protected before Citus takes it (docs/citus.md, "Distributing a protected table"):
# create_distributed_table, create_reference_table, alter_distributed_table and
# undistribute_table keep its protection, in the shape of what Citus made of it, and the
# resource's mark; per-row mode, create_distributed_table_concurrently and a Citus local table
# are refused (0A000) and leave it as it was.
shape_of() { q "SELECT shape || ' ' || active FROM fencing_protected_tables WHERE relation = '$1'::regclass"; }
q "CREATE TABLE jobs (id int PRIMARY KEY, v int)"
q "SELECT fencing_protect('jobs', 'jobs')" >/dev/null
expect "a current holder's write to the protected table" ok "$(write 10 "INSERT INTO jobs SELECT g, 1 FROM generate_series(1, 20) g")"
q "CREATE TABLE jobs_row (id int PRIMARY KEY, v int)"
q "SELECT fencing_protect('jobs_row')" >/dev/null
expect "create_distributed_table of a table protected in per-row mode" 0A000 \
    "$(state "SELECT create_distributed_table('jobs_row', 'id')")"
expect "it stays a per-row table of the coordinator" "set-based true per-row" \
    "$(q "SELECT shape || ' ' || active || ' ' || mode FROM fencing_protected_tables WHERE relation = 'jobs_row'::regclass")"
expect "create_distributed_table_concurrently of a protected table" 0A000 \
    "$(state "SELECT create_distributed_table_concurrently('jobs', 'id')")"
expect "citus_add_local_table_to_metadata of a protected table (a Citus local table)" 0A000 \
    "$(state "SELECT citus_add_local_table_to_metadata('jobs')")"
q "ALTER TABLE jobs ADD COLUMN code int"
q "CREATE TABLE kinds (id int PRIMARY KEY)"
q "SELECT create_reference_table('kinds')" >/dev/null
expect "a foreign key from a protected table to a reference table (Citus would make it a Citus local table) is refused" 42710 \
    "$(state "ALTER TABLE jobs ADD FOREIGN KEY (code) REFERENCES kinds (id)")"
expect "the table stayed out of Citus's metadata" 0 "$(q "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass")"
expect "still protected on the coordinator" "set-based true" "$(shape_of jobs)"
expect "a stale write to it is refused" FT001 "$(write 9 "UPDATE jobs SET v = 2 WHERE id = 1")"
expect "create_distributed_table of the protected table beside another expression" 0A000 \
    "$(state "SELECT create_distributed_table('jobs', 'id'), 1")"
expect "… beside a FROM list" 0A000 "$(state "SELECT create_distributed_table('jobs', 'id') FROM generate_series(1, 1)")"
expect "… with an argument computed by a subquery" 0A000 "$(state "SELECT create_distributed_table('jobs', (SELECT 'id'))")"
expect "create_distributed_table of the protected table" ok "$(state "SELECT create_distributed_table('jobs', 'id', shard_count => 4)")"
expect "it is distributed" 1 "$(q "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass AND partmethod = 'h'")"
expect "and protected in the Citus shape" "citus true" "$(shape_of jobs)"
for n in 1 2; do
    port=$((BASE + n))
    expect "worker :$port: every shard of jobs there carries the marker" "$(shards_on "$port" jobs)" "$(markers "$port" jobs)"
done
expect "its rows were kept" 20 "$(q "SELECT count(*) FROM jobs")"
expect "stale 9 after distributing, on every shard (the resource's mark kept)" FT001 "$(write 9 "UPDATE jobs SET v = -1")"
expect "a write to it entering at a worker" FT004 "$(wstate "UPDATE jobs SET v = -1 WHERE id = 1")"
expect "holder 11" ok "$(write 11 "UPDATE jobs SET v = 11")"
expect "alter_distributed_table of the protected table (Citus re-creates it)" ok \
    "$(state "SELECT alter_distributed_table('jobs', shard_count := 6)")"
expect "protected in the Citus shape" "citus true" "$(shape_of jobs)"
expect "its 6 shards carry the marker" 6 "$(( $(markers $((BASE + 1)) jobs) + $(markers $((BASE + 2)) jobs) ))"
expect "stale 10 after alter_distributed_table" FT001 "$(write 10 "UPDATE jobs SET v = -1")"
expect "holder 12" ok "$(write 12 "UPDATE jobs SET v = 12")"
expect "undistribute_table of the protected table" ok "$(state "SELECT undistribute_table('jobs')")"
expect "a protected table of the coordinator again" "set-based true" "$(shape_of jobs)"
expect "stale 11 after undistribute_table" FT001 "$(write 11 "UPDATE jobs SET v = -1")"
expect "holder 13" ok "$(write 13 "UPDATE jobs SET v = 13")"
expect "create_reference_table of the protected table" ok "$(state "SELECT create_reference_table('jobs')")"
expect "a protected reference table" "citus true" "$(shape_of jobs)"
expect "stale 12 after create_reference_table" FT001 "$(write 12 "UPDATE jobs SET v = -1")"
expect "holder 14" ok "$(write 14 "UPDATE jobs SET v = 14")"
expect "no stale value anywhere" "20 0" "$(q "SELECT count(*) || ' ' || count(*) FILTER (WHERE v = -1) FROM jobs")"
q "CREATE TABLE jobs2 (id int PRIMARY KEY, v int)"
q "SELECT fencing_protect('jobs2', 'jobs')" >/dev/null
expect "create_distributed_table rolled back to a savepoint" ok \
    "$(state "BEGIN; SAVEPOINT s; SELECT create_distributed_table('jobs2', 'id'); ROLLBACK TO s; COMMIT;")"
expect "the table as it was" "set-based true" "$(shape_of jobs2)"
expect "a cursor of create_distributed_table never fetched, and a stale write beside it" FT001 \
    "$(write 13 "DECLARE c CURSOR FOR SELECT create_distributed_table('jobs2', 'id'); INSERT INTO jobs2 VALUES (1, 1)")"
# Code run by the call's own DDL (an event trigger) cannot write the table while it is taken.
q "CREATE TABLE evt (id int PRIMARY KEY, v int)"
q "SELECT fencing_protect('evt', 'jobs')" >/dev/null
q "CREATE TABLE evt_log (state text)"
q "CREATE SEQUENCE evt_ids"
q "CREATE FUNCTION evt_write() RETURNS event_trigger LANGUAGE plpgsql AS \$\$
   BEGIN
     IF current_setting('evt.go', true) = '1' THEN
       BEGIN INSERT INTO public.evt VALUES (nextval('public.evt_ids'), -1);
             INSERT INTO public.evt_log VALUES ('written');
       EXCEPTION WHEN others THEN INSERT INTO public.evt_log VALUES (SQLSTATE); END;
     END IF;
   END \$\$"
q "CREATE EVENT TRIGGER evt_write ON ddl_command_end EXECUTE FUNCTION evt_write()"
expect "create_distributed_table with an event trigger writing the table during its DDL" ok \
    "$(state "SET evt.go = '1'; SELECT create_distributed_table('evt', 'id')")"
expect "alter_distributed_table with it" ok "$(state "SET evt.go = '1'; SELECT alter_distributed_table('evt', shard_count := 6, cascade_to_colocated := false)")"
expect "… none of its writes went through (FT004 while the protection was off)" "0 0 true" \
    "$(q "SELECT count(*) FILTER (WHERE state = 'written') || ' ' || (SELECT count(*) FROM evt) || ' ' || bool_or(state = 'FT004') FROM evt_log")"
expect "… and it tried" t "$(q "SELECT count(*) > 0 FROM evt_log")"
q "DROP EVENT TRIGGER evt_write"
expect "create_distributed_table of a PL/pgSQL variable" ok \
    "$(state "DO \$\$ DECLARE t regclass := 'jobs2'; BEGIN PERFORM create_distributed_table(t, 'id'); END \$\$")"
expect "protected in the Citus shape" "citus true" "$(shape_of jobs2)"
expect "stale 13" FT001 "$(write 13 "INSERT INTO jobs2 VALUES (1, 1)")"

# A table taken back from Citus can be protected; its fence holds.
q "CREATE TABLE back (account int PRIMARY KEY, v int)"
q "SELECT create_distributed_table('back', 'account')" >/dev/null
q "SELECT undistribute_table('back')" >/dev/null 2>&1
expect "fencing_protect of a table taken back from Citus (undistribute_table)" ok "$(state "SELECT fencing_protect('back', 'back')")"
expect "a write with 20" ok "$(write 20 "INSERT INTO back VALUES (1, 1)")"
expect "a stale write with 19" FT001 "$(write 19 "UPDATE back SET v = 2 WHERE account = 1")"
# What docs/citus.md, "What is left", reports of Citus, on an unprotected distributed table: a
# stable SET expression reaches the shard as a value; volatile functions in an UPDATE and
# non-immutable ones in RETURNING are refused.
q "CREATE TABLE probe (account int PRIMARY KEY, v int, fence_token bigint)"
q "SELECT create_distributed_table('probe', 'account')" >/dev/null
shard_query=$("${PSQL[@]}" "${C[@]}" -At -c "SET pg_fencing.token = '7'" \
    -c "EXPLAIN (VERBOSE, COSTS OFF) UPDATE probe SET v = 1, fence_token = current_setting('pg_fencing.token')::bigint WHERE account = 1" \
    | grep -c "fence_token = '7'::bigint" || true)
expect "a stable SET expression reaches the shard as its value" 1 "$shard_query"
expect "a volatile function in a distributed UPDATE is refused by Citus" 0A000 \
    "$(state "UPDATE probe SET v = random()::int WHERE account = 1")"
expect "a non-immutable function in a distributed RETURNING list is refused by Citus" 0A000 \
    "$(state "UPDATE probe SET v = 1 WHERE account = 1 RETURNING current_setting('pg_fencing.token', true)")"
# The bypass hunter's contract on the cluster (tests/citus/hunt.py): random writes of every path
# and token class, shard moves between them, each outcome against the model of docs/citus.md.
need_python
for seed in ${CITUS_HUNT_SEEDS:-1 2}; do
    $PY tests/citus/hunt.py --port "$BASE" --seed "$seed" --steps "${CITUS_HUNT_STEPS:-150}" || fail=1
done
# etcd locks from the coordinator's background worker (tests/citus/etcd.py).
ETCD_CLIENT_PORT=${ETCD_CITUS_PORT:-24390} ETCD_PEER_PORT=$(( ${ETCD_CITUS_PORT:-24390} + 1 ))
etcd_start
trap 'etcd_stop; stop_citus_cluster' EXIT
$PY tests/citus/etcd.py --port "$BASE" --etcd "127.0.0.1:$ETCD_CLIENT_PORT" || fail=1
[ "${fail:-0}" -eq 0 ] || { echo "citus: FAILED"; exit 1; }
echo "citus: all checks passed"
