"""The bypass hunter: random sequences of writes, each through a random token source and write
path, against protected tables in random states, on a real server; every outcome is compared
with a small model of the documented contract (docs/security.md, "Token sources";
docs/guarantees.md, "The rule" and "When a protection is not active"; docs/leases.md, "The time
fence": writes carrying the tokens of live, expired and released PostgreSQL leases), with the
server restarted with and without the library preloaded (docs/design.md, "The set-based shape").
The model is written from the documents, not from the implementation (it does not use fencing-core).

    hunt.py --dsn DSN --pub-dsn DSN [--seed S] [--sequences N] [--steps N] [--tables r,p,pp,...] [--no-states]
            [--pg-ctl PATH --pgdata DIR --pg-log FILE | --no-preload]

Seeded and reproducible. On a disagreement it shrinks the sequence (drops steps while the
disagreement stays) and prints the shortest failing sequence and its seed, then exits 1.
"""
import argparse
import os
import random
import subprocess
import time
import sys

import psycopg2

OUTCOMES = {}  # how often each outcome was seen, to show the sequences exercise every answer
# The same per preloading state and shape of the written table: {(preloaded, shape, outcome): n}.
PRELOAD_OUTCOMES = {}
# Bulk deletes (runs): admitted ones, and later inserts of a key one of them deleted, by outcome
# (an FT001 there below the run's token is the run refusing a stale writer).
BULK = {"admitted": 0, "insert after": {}}
# Writes judged without the library preloaded, per table ("r", "p", ...): refused (FT004) only for
# that (set-based, active otherwise), and admitted (row-trigger).
NOT_PRELOADED = {"refused only for it": {}, "admitted": {}}
BIG = 10_000_000  # every configured or frozen token: if one ever counted, the mark would jump here

# Token sources and whether a token from them counts (docs/security.md, "Token sources").
# Each maps to (role, how the write is run); "counts" is the model's answer.
SOURCES = {
    "set_local": True,            # BEGIN; SET LOCAL token = t; write
    "set_in_txn": True,           # BEGIN; SET token = t; write
    "savepoint_back": True,       # SET LOCAL t; SAVEPOINT; SET LOCAL other; ROLLBACK TO; write
    "connection_option": True,    # options=-c pg_fencing.token=t
    "connection_option_reset": True,  # the same, then RESET inside the transaction
    "session_scope_set": True,    # token_scope = session (role setting), SET t earlier
    "set_earlier": False,         # SET t in an earlier transaction (token_scope = transaction)
    "role_config": False,         # ALTER ROLE ... SET pg_fencing.token (BIG)
    "role_config_reset": False,   # SET LOCAL t; RESET pg_fencing.token -> the role's BIG
    "role_config_default": False,  # SET LOCAL t; SET LOCAL ... TO DEFAULT
    "role_config_set_config_null": False,  # SET LOCAL t; set_config(..., NULL, true)
    "role_config_reset_all": False,  # SET LOCAL t; RESET ALL
    "role_config_discard_all": False,  # SET t; DISCARD ALL; write
    "session_scope_config": False,  # token_scope = session and a role token (BIG)
    "function_set_clause": False,  # SET LOCAL t; a function with SET pg_fencing.token = BIG writes
    "definer_set_clause": False,  # a superuser's SECURITY DEFINER function with SET clause, by a role without rights
    # SAVEPOINT; a new lease granted; SET LOCAL its token; the write; ROLLBACK TO SAVEPOINT (the
    # grant is gone); SET LOCAL the same token; the write again, which is what is judged: a token
    # no lease holds, in the lease range (FT003 wherever a token would be admitted)
    "lease_savepoint": True,
}
PATHS = ["insert", "upsert", "update", "update_key", "delete", "merge", "copy", "truncate",
         "view_update", "plpgsql", "prepared", "fenced", "prepared_insert", "insert_select",
         "bulk_delete", "bulk_delete", "bulk_delete"]
# "bulk_delete" (three times as likely as each other path: most writes are refused, and an
# admitted one is what a later stale insert of its key meets): the key deleted in one statement with BULK_PAD keys inserted just before in the
# same transaction (fresh keys, never written again), so that the transaction's tombstones are
# one run (docs/design.md, "Tombstone runs": 64 keys or more of one token) and the key's later
# writes are judged against the run. The padding INSERT is refused where the key's DELETE would
# be, and also below the tombstone floor (a fresh key's mark).
BULK_PAD = 70
# Sources that run the write inside a function body: only SQL statements can go there.
IN_FUNCTION = {"function_set_clause", "definer_set_clause"}
SQL_ONLY = {"insert", "upsert", "update", "update_key", "delete", "bulk_delete", "merge", "truncate", "view_update",
            "insert_select"}
# Table states reached by DDL (Server.set_state), and "disable_attempt": an owner's DISABLE
# TRIGGER of a protection's trigger outside a restore, which the contract refuses (55000) and
# which leaves the table active. Not generated: a trigger disabled in a restore that is the only
# one of the protection a statement fires (zz_pg_fencing_truncate for TRUNCATE, the guard for a
# per-row UPDATE or DELETE): no code of pg_fencing runs then, so nothing can refuse the write
# (docs/guarantees.md, "When a protection is not active"). The hunter found that with a
# "truncate_disabled" state (seed 1) before such a DISABLE was refused outside restores.
STATES = ["active", "after_disabled", "replica_trigger_ordinary", "disable_attempt",
          "row_trigger_shape", "set_based_shape"]
# The table's shape (docs/design.md, "The set-based shape"): fencing_protect with
# pg_fencing.set_based_shape off (the row-trigger shape: a BEFORE INSERT row trigger) or on (the
# set-based shape where the server preloads the library, as the hunter's does: INSERT and COPY
# checked by the library's hooks). Both are active; the contract is the same in each.
SHAPES = ["row_trigger_shape", "set_based_shape"]
# Schema changes the contract keeps the fence through (docs/guarantees.md, "When a protection is
# not active", the schema-change paragraph): retyping the token column, also to its own type with
# a USING clause that would rewrite every mark, is refused (55000); dropping or detaching (then
# dropping) the partition of keys below 5 of the partitioned per-row table "pp", and creating it
# again empty, raises the protection's tombstone floor to the highest token of the rows that
# left, so those keys cannot come back below their marks.
SCHEMA_CHANGES = ["retype_attempt"]
# PostgreSQL 18 only (docs/guarantees.md, "Per-row mode"): the per-row table's primary key made
# temporal, (id, during WITHOUT OVERLAPS), after fencing_protect. A tombstone fences equal keys
# only, so the protection is inactive from then on: every write FT004, and fencing_protect of
# the table (the other states' first step) is refused with 42P16. setup_once checks that a
# table whose key is temporal from the start is refused per-row protection too (42P16).
TEMPORAL = "temporal_key"
PARTITION_CHANGES = ["drop_partition", "detach_partition"]
SPLIT = 5  # pp's partitions: keys below SPLIT in pp_a, the others in pp_b
# PostgreSQL leases (docs/leases.md): steps that grant a lease (live for an hour), grant one that
# expires at once, or release the live one; a write may carry the live lease's token or an ended
# one's, or a token of the lease range that no grant of this database can place ("unplaced": one
# it never granted, as a copy sees the tokens of a history it lost, also before this database's
# first grant: the first replays run before any), instead of the usual token near the marks. The
# contract (docs/leases.md, "The time fence": unknown never means admitted): a token in the lease
# range (every token from 2^48 up) that no live lease holds is refused with FT003 wherever a
# token that counts would be admitted (after FT004 and FT002).
LEASE_OPS = ["grant", "grant_expired", "release"]
LEASE_FLOOR = 1 << 48
# Preloading (docs/design.md, "The set-based shape"; docs/guarantees.md, "When a protection is not
# active"; docs/operations.md): steps that restart the server without or with
# shared_preload_libraries = 'pg_fencing' (the rest of its configuration unchanged). fencing_protect
# gives a plain table the set-based shape only where its backend preloaded the library and
# pg_fencing.set_based_shape is on, else (and for a partitioned table, such as "pp") the
# row-trigger shape; a table keeps its shape until fencing_protect runs again. In a backend that
# did not preload the library every write to a set-based table is refused with FT004, on every
# path; row-trigger tables work as they do with preloading. A restart costs up to a second: rare
# steps, generated in turn (off, then on), and every replay starts (and the hunt ends) preloaded.
# After a restart and after each state step, fencing_protected_tables' shape and active columns
# are compared with the model.
PRELOAD_RATE = 0.015


class Model:
    """The documented contract, per table: resource mode (one mark) or per-row mode (row tokens
    and tombstones); a write is refused FT004 while the protection is inactive (also: a table of
    the set-based shape while the server does not preload the library), FT002 without a token
    that counts, FT001 below the mark; accepted otherwise, and the marks go up."""

    def __init__(self, tables):
        self.preloaded = True  # does every backend preload the library (every replay starts so)
        self.t = {name: {"resource": res, "subscribed": sub, "state": "active", "mark": 0,
                         "rows": {}, "tomb": {}, "floor": 0,
                         "plain": not name.startswith("pp"), "shape": None} for name, res, sub in tables}
        for name in self.t:
            self.protect(name)  # Server.setup and setup_once, with the library preloaded

    def protect(self, name, set_based_shape=True):
        """fencing_protect of `name` (pg_fencing.set_based_shape on or off) chooses its shape."""
        t = self.t[name]
        t["shape"] = "set-based" if self.preloaded and set_based_shape and t["plain"] else "row-trigger"

    def partition_gone(self, name):
        """pp's first partition dropped or detached: its rows leave, the floor takes their tokens."""
        t = self.t[name]
        gone = {k: v for k, v in t["rows"].items() if k < SPLIT}
        t["floor"] = max([t["floor"], *gone.values()])
        t["rows"] = {k: v for k, v in t["rows"].items() if k >= SPLIT}

    def active(self, name):
        t = self.t[name]
        return (not t["subscribed"] and t["state"] == "active"
                and (self.preloaded or t["shape"] != "set-based"))

    def outcome(self, name, path, key, new_key, token, time_fenced=False):
        """(sqlstate or 'ok', new table state or None). `time_fenced`: the token is in the lease
        range and no live lease holds it."""
        t = self.t[name]
        if not self.active(name):
            return "FT004", None
        if token is None:
            return "FT002", None
        if time_fenced:
            return "FT003", None
        rows, tomb = dict(t["rows"]), dict(t["tomb"])
        mark = t["mark"]
        floor = t["floor"]  # a key without a newer tombstone has the floor as its mark
        op = {"upsert": "update" if key in rows else "insert",
              "merge": "update" if key in rows else "insert",
              "copy": "insert", "prepared_insert": "insert", "insert_select": "insert", "view_update": "update", "plpgsql": "update", "prepared": "update",
              "fenced": "update" if key in rows else "insert", "bulk_delete": "delete"}.get(path, path)
        if t["resource"]:
            if token < mark:
                return "FT001", None
            mark = max(mark, token)
            if op == "insert":
                rows[key] = token
            elif op in ("update", "update_key"):
                rows.pop(key) if op == "update_key" else None
                rows[new_key if op == "update_key" else key] = token
            elif op == "delete":
                rows.pop(key)
            elif op == "truncate":
                rows = {}
        else:
            if op == "insert":
                if token < max(tomb.get(key, 0), floor):
                    return "FT001", None
                rows[key] = token
            elif op == "update":
                if token < rows[key]:
                    return "FT001", None
                rows[key] = token
            elif op == "update_key":
                if token < rows[key] or token < max(tomb.get(new_key, 0), floor):
                    return "FT001", None
                del rows[key]
                tomb[key] = max(tomb.get(key, 0), token)
                rows[new_key] = token
            elif op == "delete":
                if token < rows[key] or (path == "bulk_delete" and token < floor):
                    return "FT001", None
                del rows[key]
                tomb[key] = max(tomb.get(key, 0), token)
            elif op == "truncate":
                if rows and token < max(rows.values()):
                    return "FT001", None
                for k in rows:
                    tomb[k] = max(tomb.get(k, 0), token)
                rows = {}
        return "ok", {"rows": rows, "tomb": tomb, "mark": mark}


class Postmaster:
    """The hunter's server, restarted by pg_ctl (as the postgres OS user when run as root) with or
    without the library in shared_preload_libraries; the rest of its configuration is run.sh's."""

    def __init__(self, pg_ctl, pgdata, log):
        self.pg_ctl, self.pgdata, self.log = pg_ctl, pgdata, log
        self.preloaded = True  # run.sh starts it preloading the library
        self.restarts = 0

    def pg_ctl_run(self, *args):
        cmd = [self.pg_ctl, "-D", self.pgdata, *args]
        if os.getuid() == 0:
            cmd = ["sudo", "-u", "postgres", "--"] + cmd
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    def restart(self, preload):
        self.pg_ctl_run("-m", "fast", "-w", "-t", "60", "stop")
        libs = "pg_fencing" if preload else "''"  # pg_ctl passes -o through the shell
        self.pg_ctl_run("-l", self.log, "-w", "-t", "60", "-o", f"-c shared_preload_libraries={libs}", "start")
        self.preloaded = preload
        self.restarts += 1


class Server:
    def __init__(self, dsn, suffix, pm=None):
        self.dsn, self.sfx, self.pm = dsn, suffix, pm
        self.admin = self.conn("postgres")
        self.last_lease = None  # the token the last "lease_savepoint" write was granted

    def restart(self, preload):
        """Restart the server with (or without) the library preloaded; the admin connection is
        opened again (every write opens its own)."""
        self.admin.close()
        self.pm.restart(preload)
        self.admin = self.conn("postgres")
        cur = self.admin.cursor()
        cur.execute("SHOW shared_preload_libraries")
        libs = cur.fetchone()[0]
        if (libs == "pg_fencing") != preload:
            raise RuntimeError(f"restarted {'with' if preload else 'without'} pg_fencing preloaded, "
                               f"but shared_preload_libraries = '{libs}'")

    def view(self, name):
        """(shape, active) of `name` in fencing_protected_tables, as the admin's backend sees it."""
        cur = self.admin.cursor()
        cur.execute("SELECT shape, active FROM fencing_protected_tables WHERE relation = %s::regclass", (name,))
        row = cur.fetchone()
        return tuple(row) if row else (None, None)

    def conn(self, user, options=None):
        c = psycopg2.connect(self.dsn, user=user, options=options or "")
        c.autocommit = True
        return c

    def setup(self, tables):
        cur = self.admin.cursor()
        for name, res, _ in tables:
            if name.endswith("_sub"):
                continue  # made once by setup_once
            cur.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
            if name.startswith("pp"):
                cur.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
                cur.execute(f"CREATE TABLE {name}_a PARTITION OF {name} FOR VALUES FROM (MINVALUE) TO ({SPLIT})")
                cur.execute(f"CREATE TABLE {name}_b PARTITION OF {name} FOR VALUES FROM ({SPLIT}) TO (MAXVALUE)")
            else:
                cur.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int)")
            cur.execute("SELECT fencing_protect(%s, %s)", (name, res))
            cur.execute(f"CREATE VIEW {name}_v AS SELECT * FROM {name}")
            cur.execute(f"GRANT ALL ON {name}, {name}_v TO hunt_app, hunt_sess")

    def teardown(self, tables):
        """Drops the replay's own tables (the shared *_sub tables stay)."""
        c = self.conn("postgres")
        try:
            for name, _, _ in tables:
                if not name.endswith("_sub"):
                    c.cursor().execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        finally:
            c.close()

    def execute(self, name, path, key, new_key, token, source):
        """Run one write; its SQLSTATE, or 'ok'."""
        sql = self.write_sql(name, path, key, new_key, token)
        role = {"session_scope_set": "hunt_sess", "session_scope_config": "hunt_sess",
                "definer_set_clause": "hunt_low"}.get(source, "hunt_app")
        opts = f"-c pg_fencing.token={token}" if source.startswith("connection_option") else None
        c = self.conn(role, opts)
        cur = c.cursor()
        try:
            pre, post = [], []
            if source in ("set_local", "function_set_clause"):
                pre = [f"SET LOCAL pg_fencing.token = '{token}'"]
            elif source == "set_in_txn":
                pre = [f"SET pg_fencing.token = '{token}'"]
            elif source == "savepoint_back":
                pre = [f"SET LOCAL pg_fencing.token = '{token}'", "SAVEPOINT s",
                       f"SET LOCAL pg_fencing.token = '{token + 1}'", "ROLLBACK TO SAVEPOINT s"]
            elif source == "connection_option_reset":
                pre = ["RESET pg_fencing.token"]
            elif source in ("session_scope_set", "set_earlier"):
                cur.execute(f"SET pg_fencing.token = '{token}'")
            elif source == "role_config_reset":
                pre = [f"SET LOCAL pg_fencing.token = '{token}'", "RESET pg_fencing.token"]
            elif source == "role_config_default":
                pre = [f"SET LOCAL pg_fencing.token = '{token}'", "SET LOCAL pg_fencing.token TO DEFAULT"]
            elif source == "role_config_set_config_null":
                pre = [f"SET LOCAL pg_fencing.token = '{token}'",
                       "SELECT set_config('pg_fencing.token', NULL, true)"]
            elif source == "role_config_reset_all":
                pre = [f"SET LOCAL pg_fencing.token = '{token}'", "RESET ALL"]
            elif source == "role_config_discard_all":
                cur.execute(f"SET pg_fencing.token = '{token}'")
                cur.execute("DISCARD ALL")
            if source == "function_set_clause":
                sql = [f"SELECT hunt_frozen({q(s)})" for s in sql]
            elif source == "definer_set_clause":
                sql = [f"SELECT hunt_frozen_definer({q(s)})" for s in sql]
            def run_sql():
                for s in sql:
                    if s.startswith("COPY"):
                        import io
                        cur.copy_expert(s, io.StringIO(f"{key}\t1\n"))
                    else:
                        cur.execute(s)
            cur.execute("BEGIN")
            if source == "lease_savepoint":
                cur.execute("SAVEPOINT s")
                cur.execute("SELECT fencing_lease_acquire(%s, '1 hour')", (f"hunt-sp{self.sfx}-{time.monotonic_ns()}",))
                self.last_lease = cur.fetchone()[0]
                cur.execute("SELECT set_config('pg_fencing.token', %s, true)", (str(self.last_lease),))
                if path == "fenced":  # its token argument is the lease's too
                    sql = self.write_sql(name, path, key, new_key, self.last_lease)
                try:
                    run_sql()
                except psycopg2.Error:
                    pass  # whatever the first write met, the savepoint takes it back
                cur.execute("ROLLBACK TO SAVEPOINT s")
                cur.execute("DEALLOCATE ALL")  # a PREPARE is not rolled back
                cur.execute("SELECT set_config('pg_fencing.token', %s, true)", (str(self.last_lease),))
            for s in pre:
                cur.execute(s)
            run_sql()
            for s in post:
                cur.execute(s)
            cur.execute("COMMIT")
            return "ok"
        except psycopg2.Error as e:
            return e.pgcode or "?"
        finally:
            c.close()

    def write_sql(self, name, path, key, new_key, token):
        if path == "insert":
            return [f"INSERT INTO {name} VALUES ({key}, 1)"]
        if path == "prepared_insert":  # a one-row INSERT with its key as a parameter
            return [f"PREPARE pi(int) AS INSERT INTO {name} VALUES ($1, 1)", f"EXECUTE pi({key})"]
        if path == "insert_select":
            return [f"INSERT INTO {name} SELECT k, 1 FROM (VALUES ({key})) s(k)"]
        if path == "upsert":
            return [f"INSERT INTO {name} VALUES ({key}, 1) ON CONFLICT (id) DO UPDATE SET v = {name}.v + 1"]
        if path == "update":
            return [f"UPDATE {name} SET v = v + 1 WHERE id = {key}"]
        if path == "update_key":
            return [f"UPDATE {name} SET id = {new_key} WHERE id = {key}"]
        if path == "delete":
            return [f"DELETE FROM {name} WHERE id = {key}"]
        if path == "bulk_delete":
            self.pad = getattr(self, "pad", 1_000_000) + BULK_PAD
            lo, hi = self.pad, self.pad + BULK_PAD - 1
            return [f"INSERT INTO {name} SELECT g, 1 FROM generate_series({lo}, {hi}) g",
                    f"DELETE FROM {name} WHERE id = {key} OR id BETWEEN {lo} AND {hi}"]
        if path == "merge":
            return [f"MERGE INTO {name} t USING (VALUES ({key})) s(id) ON t.id = s.id "
                    f"WHEN MATCHED THEN UPDATE SET v = t.v + 1 WHEN NOT MATCHED THEN INSERT VALUES (s.id, 1)"]
        if path == "copy":
            return [f"COPY {name} (id, v) FROM STDIN"]
        if path == "truncate":
            return [f"TRUNCATE {name}"]
        if path == "view_update":
            return [f"UPDATE {name}_v SET v = v + 1 WHERE id = {key}"]
        if path == "plpgsql":
            return [f"SELECT hunt_exec({q(f'UPDATE {name} SET v = v + 1 WHERE id = {key}')})"]
        if path == "prepared":
            return [f"PREPARE p AS UPDATE {name} SET v = v + 1 WHERE id = $1", f"EXECUTE p({key})"]
        if path == "fenced":
            return [f"SELECT fenced_update('{name}', '{{\"id\": {key}}}', '{{\"v\": 5}}', {token})"
                    if self._exists(name, key) else
                    f"SELECT fenced_insert('{name}', '{{\"id\": {key}, \"v\": 1}}', {token})"]
        raise ValueError(path)

    def lease(self, op, state):
        """Lease step `op` on this replay's lease; `state` = {"live", "ended", "max"}."""
        cur = self.admin.cursor()
        name = f"hunt-lease{self.sfx}"
        if state["live"] is not None:
            cur.execute("SELECT fencing_lease_release(%s)", (state["live"],))
            state["ended"].append(state["live"])
            state["live"] = None
        if op == "release":
            return
        cur.execute("SELECT fencing_lease_acquire(%s, %s)", (name, "1 hour" if op == "grant" else "1 millisecond"))
        token = cur.fetchone()[0]
        state["max"] = max(state["max"], token)
        if op == "grant":
            state["live"] = token
        else:
            time.sleep(0.005)
            state["ended"].append(token)

    def _exists(self, name, key):
        cur = self.admin.cursor()
        cur.execute(f"SELECT count(*) FROM {name} WHERE id = %s", (key,))
        return cur.fetchone()[0] > 0

    def set_state(self, name, state):
        """Bring table `name` into `state`; the SQLSTATE of the state's own DDL, or 'ok'."""
        cur = self.admin.cursor()
        if state == TEMPORAL:
            cur.execute(f"ALTER TABLE {name} ADD COLUMN during int4range NOT NULL DEFAULT '[1,2)'")
            cur.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_pkey, "
                        f"ADD CONSTRAINT {name}_pkey PRIMARY KEY (id, during WITHOUT OVERLAPS)")
            return "ok"
        try:
            if state == "row_trigger_shape":
                cur.execute("SET pg_fencing.set_based_shape = off")
            cur.execute("SELECT fencing_protect(%s, (SELECT resource FROM _pg_fencing.protected_table WHERE relid = %s::regclass))",
                        (name, name))
        except psycopg2.Error as e:
            return e.pgcode
        finally:
            cur.execute("RESET pg_fencing.set_based_shape")
        # Disabling is refused outside a restore (check_function_bodies = off), and ENABLE
        # TRIGGER ALL is repaired by the DDL event trigger unless that is off: the states a
        # restore stopped half-way, or a superuser, can leave.
        if state == "after_disabled":
            cur.execute("SET check_function_bodies = off")
            cur.execute(f"ALTER TABLE {name} DISABLE TRIGGER zz_pg_fencing_after")
            cur.execute("RESET check_function_bodies")
        elif state == "replica_trigger_ordinary":
            cur.execute("ALTER EVENT TRIGGER pg_fencing_ddl_end DISABLE")
            cur.execute(f"ALTER TABLE {name} ENABLE TRIGGER ALL")
            cur.execute("ALTER EVENT TRIGGER pg_fencing_ddl_end ENABLE")
        elif state == "retype_attempt":
            try:
                cur.execute(f"ALTER TABLE {name} ALTER COLUMN fence_token TYPE bigint USING 0")
            except psycopg2.Error as e:
                return e.pgcode
        elif state in PARTITION_CHANGES:
            if state == "drop_partition":
                cur.execute(f"DROP TABLE {name}_a")
            else:
                cur.execute(f"ALTER TABLE {name} DETACH PARTITION {name}_a")
                cur.execute(f"DROP TABLE {name}_a")
            cur.execute(f"CREATE TABLE {name}_a PARTITION OF {name} FOR VALUES FROM (MINVALUE) TO ({SPLIT})")
        elif state == "disable_attempt":
            trigger = random.Random(name).choice(["zz_pg_fencing_guard", "zz_pg_fencing_truncate", "zz_pg_fencing_after"])
            try:
                cur.execute(f"ALTER TABLE {name} DISABLE TRIGGER {trigger}")
            except psycopg2.Error as e:
                return e.pgcode
        return "ok"


def q(s):
    return "'" + s.replace("'", "''") + "'"


def server_major(dsn):
    c = psycopg2.connect(dsn, user="postgres")
    try:
        cur = c.cursor()
        cur.execute("SELECT current_setting('server_version_num')::int / 10000")
        return cur.fetchone()[0]
    finally:
        c.close()


def setup_once(dsn, pub_dsn):
    """Roles, helper functions, and two tables written by a subscription whose publication
    lacks pg_fencing's tables (a publisher without the extension): inactive for good."""
    a = psycopg2.connect(dsn, user="postgres")
    a.autocommit = True
    cur = a.cursor()
    if server_major(dsn) >= 18:
        cur.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        cur.execute("CREATE TABLE IF NOT EXISTS hunt_temporal (id int, during int4range, v int, "
                    "PRIMARY KEY (id, during WITHOUT OVERLAPS))")
        try:
            cur.execute("SELECT fencing_protect('hunt_temporal')")
            got = "ok"
        except psycopg2.Error as e:
            got = e.pgcode
        if got != "42P16":
            print(f"hunt: per-row protection of a table with a temporal key: the contract says 42P16, "
                  f"the server answered {got}")
            sys.exit(1)
    for r in ("hunt_app", "hunt_sess", "hunt_low"):
        cur.execute(f"DROP ROLE IF EXISTS {r}")
        cur.execute(f"CREATE ROLE {r} LOGIN")
    cur.execute(f"ALTER ROLE hunt_app SET pg_fencing.token = '{BIG}'")
    cur.execute(f"ALTER ROLE hunt_sess SET pg_fencing.token = '{BIG + 1}'")
    cur.execute("ALTER ROLE hunt_sess SET pg_fencing.token_scope = 'session'")
    cur.execute("CREATE OR REPLACE FUNCTION hunt_exec(sql text) RETURNS void LANGUAGE plpgsql "
                "AS $$ BEGIN EXECUTE sql; END $$")
    cur.execute(f"CREATE OR REPLACE FUNCTION hunt_frozen(sql text) RETURNS void LANGUAGE plpgsql "
                f"SET pg_fencing.token = '{BIG + 2}' AS $$ BEGIN EXECUTE sql; END $$")
    cur.execute(f"CREATE OR REPLACE FUNCTION hunt_frozen_definer(sql text) RETURNS void LANGUAGE plpgsql "
                f"SECURITY DEFINER SET pg_fencing.token = '{BIG + 3}' AS $$ BEGIN EXECUTE sql; END $$")
    cur.execute("GRANT EXECUTE ON FUNCTION hunt_exec(text), hunt_frozen(text), hunt_frozen_definer(text) TO PUBLIC")
    p = psycopg2.connect(pub_dsn, user="postgres")
    p.autocommit = True
    pc = p.cursor()
    for name in ("r_sub", "p_sub"):
        pc.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int, fence_token bigint)")
        cur.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int)")
        cur.execute("SELECT fencing_protect(%s, %s)", (name, "r_sub-res" if name == "r_sub" else None))
        cur.execute(f"CREATE VIEW {name}_v AS SELECT * FROM {name}")
        cur.execute(f"GRANT ALL ON {name}, {name}_v TO hunt_app, hunt_sess")
    pc.execute("CREATE PUBLICATION hunt FOR TABLE r_sub, p_sub")
    pc.execute("SELECT pg_create_logical_replication_slot('hunt', 'pgoutput')")
    conninfo = pub_dsn + " user=postgres"
    cur.execute(f"CREATE SUBSCRIPTION hunt CONNECTION {q(conninfo)} PUBLICATION hunt "
                "WITH (create_slot = false, slot_name = 'hunt', copy_data = false)")
    a.close()
    p.close()


def gen_sequence(rng, steps, tables, states, temporal=False, preload=False):
    seq = []
    preloaded = True
    for _ in range(steps):
        if preload and rng.random() < PRELOAD_RATE:
            seq.append(("preload", "preload_off" if preloaded else "preload_on"))
            preloaded = not preloaded
            continue
        table = rng.choice(tables)
        if rng.random() < 0.06:
            seq.append(("lease", rng.choice(LEASE_OPS)))
            continue
        if states and rng.random() < 0.12 and table in ("r", "p", "pp"):
            seq.append(("state", table, rng.choice(STATES + SCHEMA_CHANGES
                                                   + (PARTITION_CHANGES if table == "pp" else [])
                                                   + ([TEMPORAL] if temporal and table == "p" else []))))
            continue
        source = rng.choice(list(SOURCES))
        path = rng.choice(sorted(SQL_ONLY) if source in IN_FUNCTION else PATHS)
        seq.append(("write", table, path, source, rng.randint(1, 6), rng.randint(7, 9), rng.randint(-4, 6),
                    rng.choice(["near"] * 4 + ["live", "ended", "unplaced"])))
    return seq


def run(dsn, seq, replay_id, pm=None, verbose=False):
    """Replay `seq` on fresh tables; the index of the first disagreement and its description
    (-1: the tables' shapes right after setup)."""
    sfx = f"_{replay_id}"
    tables = [("r" + sfx, f"hunt-res{sfx}", False), ("p" + sfx, None, False), ("pp" + sfx, None, False),
              ("r_sub", "r_sub-res", True), ("p_sub", None, True)]
    name_of = {"r": "r" + sfx, "p": "p" + sfx, "pp": "pp" + sfx, "r_sub": "r_sub", "p_sub": "p_sub"}
    srv = Server(dsn, sfx, pm)
    srv.setup(tables)
    model = Model(tables)
    lease = {"live": None, "ended": [], "max": 0}
    try:
        why = view_disagreement(srv, model, "after setup")
        if why:
            return -1, why
        return replay_steps(srv, model, seq, name_of, lease, verbose)
    finally:
        # The model knows only this replay's lease: one left live would make its token count
        # in every later replay, where a "near" token may hit it (tokens are granted one apart).
        if lease["live"] is not None:
            srv.admin.cursor().execute("SELECT fencing_lease_release(%s)", (lease["live"],))
        srv.admin.close()
        # Every replay starts, and the hunt ends, with the library preloaded.
        if pm is not None and not pm.preloaded:
            pm.restart(True)
        # The replay's tables go with it (but for the replay that reports a disagreement): every
        # DDL statement's end checks each protected table of the database, so tables kept from
        # earlier replays made each replay slower than the one before (60 sequences took 268 s,
        # 12 took 23 s).
        if not verbose:
            srv.teardown(tables)


def view_disagreement(srv, model, when):
    """fencing_protected_tables against the model: each table's shape, and whether it is active
    (docs/reference.md: false for exactly the reasons that refuse every write with FT004, in the
    backend reading the view). A description of the first difference, or None."""
    for name, t in model.t.items():
        shape, active = srv.view(name)
        if shape != t["shape"]:
            return (f"{when}: fencing_protected_tables says {name} has the {shape} shape, the model "
                    f"the {t['shape']} shape (preloaded: {model.preloaded})")
        if active != model.active(name):
            return (f"{when}: fencing_protected_tables says {name} is {'' if active else 'not '}active, "
                    f"the contract says {'' if model.active(name) else 'not '}active (state {t['state']}, "
                    f"{t['shape']} shape, preloaded: {model.preloaded})")
    return None


def replay_steps(srv, model, seq, name_of, lease, verbose):
    """The steps of `run`, judged one by one against the model."""
    for i, step in enumerate(seq):
        if step[0] == "lease":
            srv.lease(step[1], lease)
            continue
        if step[0] == "preload":
            model.preloaded = step[1] == "preload_on"
            srv.restart(model.preloaded)
            if verbose:
                print(f"  step {i}: the server restarted {'with' if model.preloaded else 'without'} the library preloaded")
            why = view_disagreement(srv, model, f"step {i} ({step[1]})")
            if why:
                return i, why
            continue
        if step[0] == "state":
            name = name_of[step[1]]
            if model.t[name]["state"] == TEMPORAL:
                # fencing_protect (each state's first step) refuses a temporal key: 42P16.
                got = srv.set_state(name, step[2]) if step[2] != TEMPORAL else "42P16"
                if got != "42P16":
                    return i, f"step {i}: state {step[2]} of {name} with a temporal key: the contract says 42P16, the server answered {got}"
                continue
            got = srv.set_state(name, step[2])
            refused = step[2] in ("disable_attempt", "retype_attempt")
            want = "55000" if refused else "ok"
            if got != want:
                    return i, f"step {i}: state {step[2]} of {name}: the contract says {want}, the server answered {got}"
            # Its DDL runs the DDL event trigger, which puts every REPLICA trigger made ordinary
            # back (docs/guarantees.md): other tables left in that state are active again.
            for other, t in model.t.items():
                if other != name and t["state"] == "replica_trigger_ordinary":
                    t["state"] = "active"
            if step[2] in PARTITION_CHANGES:
                model.partition_gone(name)
            model.t[name]["state"] = ("active" if refused or step[2] in PARTITION_CHANGES or step[2] in SHAPES
                                      else step[2])
            if step[2] != TEMPORAL:  # every other state's first step is fencing_protect
                model.protect(name, step[2] != "row_trigger_shape")
            why = view_disagreement(srv, model, f"step {i} (state {step[2]} of {name})")
            if why:
                return i, why
            continue
        _, table, path, source, key, new_key, delta, kind = step
        name = name_of[table]
        t = model.t[name]
        rows = t["rows"]
        # Writes touch a row that exists (an UPDATE of nothing fires no row trigger); inserts a new key.
        if path in ("update", "update_key", "delete", "bulk_delete", "view_update", "plpgsql", "prepared"):
            if not rows:
                continue
            key = sorted(rows)[key % len(rows)]
            if path == "update_key" and (t["resource"] or new_key in rows):
                continue
        elif path in ("insert", "copy", "prepared_insert", "insert_select") and key in rows:
            continue
        # Every other new key is one a bulk delete left in a run, while there is one: what a
        # zombie's re-insert after a purge meets.
        gone = sorted(k for k in t.get("bulk_keys", {}) if k not in rows)
        if path in ("insert", "copy", "prepared_insert", "insert_select", "upsert", "merge") and gone \
                and (key + new_key) % 2 == 0:
            key = gone[key % len(gone)]
        high = max([t["mark"], t["floor"], *rows.values(), *t["tomb"].values(), 1])
        token = max(1, high + delta)
        if kind == "live" and lease["live"] is not None:
            token = lease["live"]
        elif kind == "ended" and lease["ended"]:
            token = lease["ended"][(key + new_key) % len(lease["ended"])]
        elif kind == "unplaced":
            # Never granted here: the floor of the range, a token of a lost history below the
            # clock, or one far above the clock (delta picks which).
            token = [LEASE_FLOOR, LEASE_FLOOR + 10**12 * (key + new_key), (1 << 62) + key][delta % 3]

        time_fenced = (token >= LEASE_FLOOR and token != lease["live"]) or source == "lease_savepoint"
        counts = SOURCES[source] or path == "fenced"
        want, new_state = model.outcome(name, path, key, new_key, token if counts else None, time_fenced)
        got = srv.execute(name, path, key, new_key, token, source)
        if source == "lease_savepoint" and srv.last_lease is not None:
            lease["max"] = max(lease["max"], srv.last_lease)
            lease["ended"].append(srv.last_lease)
        where = f"{t['shape']} shape, {'' if model.preloaded else 'not '}preloaded"
        if verbose:
            print(f"  step {i}: {name} {path} key={key} token={token} via {source} ({where}): model {want}, server {got}")
        # A temporal key has no unique constraint on id alone: PostgreSQL refuses ON CONFLICT (id)
        # while planning (42P10), before any trigger; nothing is written either way.
        if t["state"] == TEMPORAL and path == "upsert" and got == "42P10":
            want = got
        if got != want:
            return i, (f"step {i}: {path} of {name} (key {key}{', new key ' + str(new_key) if path == 'update_key' else ''}) "
                       f"with token {token} via {source} ({where}): the contract says {want}, the server answered {got}")
        OUTCOMES[got] = OUTCOMES.get(got, 0) + 1
        bulk_keys = t.setdefault("bulk_keys", {})
        if path == "bulk_delete" and got == "ok":
            BULK["admitted"] += 1
            bulk_keys[key] = token
        elif path in ("insert", "copy", "prepared_insert", "insert_select", "upsert", "merge") and key in bulk_keys:
            outcome = f"{got} below its run's token" if token < bulk_keys[key] else got
            BULK["insert after"][outcome] = BULK["insert after"].get(outcome, 0) + 1
            if got == "ok":
                del bulk_keys[key]
        k = (model.preloaded, t["shape"], got)
        PRELOAD_OUTCOMES[k] = PRELOAD_OUTCOMES.get(k, 0) + 1
        if not model.preloaded:
            kind = ("refused only for it" if t["shape"] == "set-based" and not t["subscribed"] and t["state"] == "active"
                    else "admitted" if got == "ok" else None)
            if kind:
                NOT_PRELOADED[kind][table] = NOT_PRELOADED[kind].get(table, 0) + 1
        if new_state:
            t.update(new_state)
    return None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--pub-dsn", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sequences", type=int, default=30)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tables", default="r,p,pp,r_sub,p_sub",
                    help="which tables to write: r, p (resource and per-row mode), pp (per-row, partitioned), "
                         "r_sub, p_sub (subscribed)")
    ap.add_argument("--no-states", action="store_true", help="no DDL and no restarts: the tables stay as protected")
    ap.add_argument("--no-preload", action="store_true", help="no restarts without the library preloaded")
    ap.add_argument("--pg-ctl", help="the server's pg_ctl, to restart it with and without preloading")
    ap.add_argument("--pgdata", help="the server's data directory")
    ap.add_argument("--pg-log", help="the server's log file")
    args = ap.parse_args()
    preload = not args.no_states and not args.no_preload
    pm = None
    if preload:
        if not (args.pg_ctl and args.pgdata and args.pg_log):
            ap.error("restarts with and without preloading need --pg-ctl, --pgdata and --pg-log (or --no-preload)")
        pm = Postmaster(args.pg_ctl, args.pgdata, args.pg_log)
    c = psycopg2.connect(args.dsn, user="postgres")
    cur = c.cursor()
    cur.execute("SHOW shared_preload_libraries")
    if cur.fetchone()[0] != "pg_fencing":
        print("hunt: the server must start with shared_preload_libraries = 'pg_fencing' (run.sh)")
        return 1
    c.close()
    setup_once(args.dsn, args.pub_dsn)
    temporal = server_major(args.dsn) >= 18  # the temporal_key state (PostgreSQL 18)
    rng = random.Random(args.seed)
    replay = 0
    writes = 0
    for n in range(args.sequences):
        seq = gen_sequence(rng, args.steps, args.tables.split(","), not args.no_states, temporal, preload)
        replay += 1
        bad, why = run(args.dsn, seq, replay, pm)
        writes += sum(1 for s in seq if s[0] == "write")
        if bad is None:
            continue
        # Shrink: drop steps while the sequence still disagrees.
        seq = seq[:bad + 1]
        changed = True
        while changed:
            changed = False
            for i in range(len(seq) - 1):
                cand = seq[:i] + seq[i + 1:]
                replay += 1
                b, w = run(args.dsn, cand, replay, pm)
                if b is not None:
                    seq, why, changed = cand[:b + 1], w, True
                    break
        print(f"hunt: seed {args.seed}, sequence {n}: the server disagrees with the contract")
        print(f"  {why}")
        print("  shortest failing sequence:")
        for s in seq:
            print(f"    {s}")
        replay += 1
        run(args.dsn, seq, replay, pm, verbose=True)
        return 1
    print(f"hunt: seed {args.seed}: {args.sequences} sequences, {writes} writes generated "
          f"({sum(OUTCOMES.values())} run; outcomes {dict(sorted(OUTCOMES.items()))}); "
          "the server agreed with the contract on every one")
    print(f"  bulk deletes admitted (a run of {BULK_PAD + 1} keys each): {BULK['admitted']}; a later insert "
          f"of a key one of them deleted: {dict(sorted(BULK['insert after'].items()))}")
    if BULK["admitted"] == 0:
        print("hunt: no bulk delete was admitted: runs were not hunted")
        return 1
    for pre in (True, False):
        by_shape = {}
        for (p, shape, got), k in PRELOAD_OUTCOMES.items():
            if p == pre:
                by_shape.setdefault(shape, {})[got] = k
        total = sum(sum(o.values()) for o in by_shape.values())
        print(f"  writes judged with the library {'' if pre else 'not '}preloaded: {total} ("
              + "; ".join(f"{shape} shape {sum(o.values())}: {dict(sorted(o.items()))}"
                          for shape, o in sorted(by_shape.items())) + ")")
    if pm is not None:
        print(f"  of those not preloaded, per table: refused only for that (set-based shape) "
              f"{dict(sorted(NOT_PRELOADED['refused only for it'].items()))}, admitted (row-trigger shape) "
              f"{dict(sorted(NOT_PRELOADED['admitted'].items()))}; {pm.restarts} restarts")
    # A hunt that never saw an answer of the contract tested nothing there.
    missing = {"ok", "FT001", "FT002", "FT003", "FT004"} - set(OUTCOMES)
    if missing:
        print(f"hunt: no write got {sorted(missing)}: the sequences are too short to hunt")
        return 1
    # Nor one that never wrote where the library was not preloaded: to a set-based table that
    # would be active otherwise (the refusal), and admitted to a row-trigger table (which needs
    # no preloading).
    if preload:
        unseen = [what for what, kind in (("a write to an otherwise active set-based table", "refused only for it"),
                                          ("an admitted write to a row-trigger table", "admitted"))
                  if not NOT_PRELOADED[kind]]
        if unseen:
            print(f"hunt: never judged {' nor '.join(unseen)} without the library preloaded: "
                  "the sequences are too short to hunt")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
