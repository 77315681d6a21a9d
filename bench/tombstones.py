"""Tombstone storage per deleted key, before and after fencing_prune_tombstones (issue 17).

A per-row protected queue table gets BENCH_TOMBSTONES keys (default 1,000,000) inserted and
deleted in batches of 10,000, batch b with token b (a queue whose lock holders take turns):
once without pruning (VACUUM every 10 batches, as autovacuum would), once pruned every 10 batches
at floor b - 10 (followed by VACUUM). Printed: the size of the tombstone tables (row_tombstone, tombstone_run and
tombstone_chunk: heaps, indexes and TOAST) at the end of
each. With etcd and the worker (bench/run.sh starts them), a third run takes each batch's token
with fencing_acquire, inserts, updates and deletes the batch's keys, and leaves pruning to the
pruner worker (fencing_tombstone_retention of RETENTION_S seconds, pruner every second). A stale
re-insert of a pruned key must still be refused (FT001), or this fails.

Usage: tombstones.py  (psql reaches the server through PGHOST/PGPORT/PGUSER/PGDATABASE)
"""
import os
import subprocess
import sys

N = int(os.environ.get("BENCH_TOMBSTONES", "1000000"))
BATCH = 10_000


def psql(sql, check=True):
    r = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-f", "-"],
                       input=sql, text=True, capture_output=True)
    if check and r.returncode != 0:
        raise SystemExit(f"tombstones: psql failed:\n{r.stderr[-2000:]}")
    return r


# Tombstones live in row_tombstone (one row per key) and in tombstone runs (a bulk delete's keys,
# src/state/tombstone_runs.rs): their heaps, indexes and TOAST together.
TOMB_TABLES = ("_pg_fencing.row_tombstone", "_pg_fencing.tombstone_run", "_pg_fencing.tombstone_chunk")
TOMB_SIZE = "SELECT " + " + ".join(f"pg_total_relation_size('{t}')" for t in TOMB_TABLES)
VACUUM = "VACUUM " + ", ".join(TOMB_TABLES) + ";"
VACUUM_FULL = "VACUUM FULL " + ", ".join(TOMB_TABLES) + ";"


def size(step, keys):
    psql(VACUUM)
    out = psql("SELECT (SELECT count(*) FROM _pg_fencing.row_tombstone) "
               "+ (SELECT coalesce(sum(key_count), 0) FROM _pg_fencing.tombstone_run), "
               f"({TOMB_SIZE});").stdout.strip()
    count, total = (int(x) for x in out.split("|"))
    return step, keys, count, total


def queue(table, batches, prune_every, keep):
    """Insert and delete `batches` batches of keys, batch b with token b; with `prune_every`,
    every so many batches prune at floor b - keep (tombstones of the last `keep` batches stay)
    and VACUUM, as autovacuum would. Returns the largest size seen and the final size."""
    psql(f"DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id bigint PRIMARY KEY, payload text);"
         f"SELECT fencing_protect('{table}');")
    largest = 0
    for b in range(1, batches + 1):
        lo, hi = (b - 1) * BATCH + 1, b * BATCH
        psql(f"BEGIN; SET LOCAL pg_fencing.token = '{b}';"
             f"INSERT INTO {table} SELECT g, 'job' FROM generate_series({lo}, {hi}) g;"
             f"DELETE FROM {table} WHERE id BETWEEN {lo} AND {hi}; COMMIT;")
        if not prune_every and b % 10 == 0:
            # VACUUM as autovacuum would (merged tombstone runs leave dead rows behind).
            psql(VACUUM)
        if prune_every and b % prune_every == 0 and b > keep:
            psql(f"SELECT fencing_prune_tombstones('{table}', {b - keep}); {VACUUM}")
            largest = max(largest, int(psql(TOMB_SIZE).stdout))
    return largest


RETENTION_S = 5
POLICY_STALE = ""


def policy_queue(batches, retention_s):
    """The queue with fencing_tombstone_retention and the pruner worker; returns the largest
    size seen, the run's seconds and the first batch's token."""
    global POLICY_STALE
    import time
    psql("DROP TABLE IF EXISTS tomb_policy; CREATE TABLE tomb_policy (id bigint PRIMARY KEY, state text);"
         f"SELECT fencing_protect('tomb_policy'); SELECT fencing_tombstone_retention('tomb_policy', '{retention_s} s');")
    largest, first, t0 = 0, None, time.time()
    for b in range(1, batches + 1):
        lo, hi = (b - 1) * BATCH + 1, b * BATCH
        token = int(psql("SELECT fencing_acquire('tomb-policy-queue')").stdout.strip())
        first = first or token
        psql(f"BEGIN; SET LOCAL pg_fencing.token = '{token}';"
             f"INSERT INTO tomb_policy SELECT g, 'new' FROM generate_series({lo}, {hi}) g;"
             f"UPDATE tomb_policy SET state = 'done' WHERE id BETWEEN {lo} AND {hi};"
             f"DELETE FROM tomb_policy WHERE id BETWEEN {lo} AND {hi}; COMMIT;"
             "SELECT fencing_release('tomb-policy-queue');")
        if b % 10 == 0:
            # VACUUM as autovacuum would, then the size.
            psql(VACUUM)
            largest = max(largest, int(psql(TOMB_SIZE).stdout))
    seconds = time.time() - t0
    # Let the retention pass the last batch, then one more round.
    time.sleep(retention_s + 3)
    largest = max(largest, int(psql(TOMB_SIZE).stdout))
    POLICY_STALE = (f"BEGIN; SET LOCAL pg_fencing.token = '{first}'; "
                    "INSERT INTO tomb_policy VALUES (1, 'zombie'); COMMIT;")
    return largest, seconds, first


def main():
    batches = max(1, N // BATCH)
    keys = batches * BATCH
    psql("CREATE EXTENSION IF NOT EXISTS pg_fencing;")
    rows = []
    # 1. No pruning: every deleted key keeps its tombstone.
    queue("tomb_bench", batches, 0, 0)
    rows.append(size("no pruning", keys))
    psql("DROP TABLE tomb_bench; " + VACUUM_FULL)
    # 2. The same queue, pruned every 10 batches below the last 10 batches' tokens (a retention
    #    of about 100,000 keys): storage stays bounded by the retained tombstones.
    keep = min(10, batches)
    largest = queue("tomb_bench", batches, 10, keep)
    step, k, count, total = size(f"pruned every 10 batches at floor b - {keep} (after the last prune)", keys)
    rows.append((step, k, count, total))
    # A pruned key (deleted in the first batch, token 1) re-inserted by a stale holder.
    stale = psql("BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO tomb_bench VALUES (1, 'zombie'); COMMIT;",
                 check=False)
    if stale.returncode == 0 or "stale fencing token" not in stale.stderr:
        raise SystemExit(f"tombstones: the stale re-insert of a pruned key was not refused:\n{stale.stderr}")
    psql("DROP TABLE tomb_bench; " + VACUUM_FULL)
    # 3. The queue with the retention policy: each batch's holder takes an etcd lock
    #    (fencing_acquire; its token is an etcd revision), inserts, updates and deletes its keys,
    #    releases; the pruner worker prunes what is older than the retention.
    policy = None
    if psql("SHOW pg_fencing.tombstone_prune_database", check=False).stdout.strip():
        policy = policy_queue(batches, RETENTION_S)
        rows.append(size(f"retention policy `fencing_tombstone_retention('…', '{RETENTION_S} s')` "
                         f"(pruner every 1 s; tokens from `fencing_acquire`), after the run", keys))
        if psql(POLICY_STALE, check=False).returncode == 0:
            raise SystemExit("tombstones: the stale re-insert of a key pruned by the policy was not refused")
        psql("DROP TABLE tomb_policy;")
    print(f"Tombstone storage (`_pg_fencing.row_tombstone`, `tombstone_run` and `tombstone_chunk`: heaps, indexes and TOAST, after VACUUM): a per-row "
          f"queue table, {keys:,} keys inserted and deleted in {batches} batches of {BATCH:,}, "
          f"batch b with token b:")
    print()
    print("| workload | tombstones kept | bytes | bytes per deleted key |")
    print("|---|---:|---:|---:|")
    for step, k, count, total in rows:
        print(f"| {step} | {count:,} | {total:,} | {total / k:.1f} |")
    print()
    peak = 2 * keep * BATCH
    print(f"With pruning the largest size seen after a prune was {largest:,} bytes: bounded by the "
          f"most tombstones alive between two prunes ({peak:,}: the {keep * BATCH:,} a prune keeps and "
          f"the {keep * BATCH:,} deleted until the next one, {largest / peak:.1f} bytes each, the space "
          f"VACUUM frees being reused), not by the keys ever deleted.")
    print("The stale re-insert of a pruned key (token 1) was refused: "
          + stale.stderr.strip().splitlines()[0].removeprefix("psql:<stdin>:1: "))
    if policy is not None:
        largest, seconds, first_token = policy
        print(f"With the retention policy ({keys:,} keys inserted, updated and deleted in {seconds:.0f} s) "
              f"the largest size seen was {largest:,} bytes, and the first batch's holder (token "
              f"{first_token}) was refused when it re-inserted a pruned key.")


if __name__ == "__main__":
    sys.exit(main())
