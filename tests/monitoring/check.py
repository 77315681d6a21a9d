"""The figures of monitoring/postgres_exporter_queries.yaml as the real exporter exports them,
and the alerts of monitoring/prometheus_alerts.yml as a real Prometheus fires them (run by
tests/monitoring/run.sh, which starts both).

  "$PY" tests/monitoring/check.py --dsn DSN --exporter URL --prometheus URL
"""
import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request

import psycopg

FAILS = []


def check(what, cond, got=None):
    print(f"  {'ok' if cond else 'FAIL'}: {what}" + ("" if cond else f" (got {got!r})"))
    if not cond:
        FAILS.append(what)


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(fn, seconds, step=0.5):
    end = time.time() + seconds
    while time.time() < end:
        try:
            v = fn()
            if v:
                return v
        except OSError:
            pass
        time.sleep(step)
    return None


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text):
    """{(name, frozenset(labels)): value} of the Prometheus text format."""
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = frozenset(LABEL.findall(m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(s, name, **labels):
    """The value of the one sample of `name` whose labels include `labels` (None if none)."""
    hits = [v for (n, ls), v in s.items() if n == name and set(labels.items()) <= dict(ls).items()]
    return hits[0] if len(hits) == 1 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--exporter", required=True)
    ap.add_argument("--prometheus", required=True)
    a = ap.parse_args()
    db = psycopg.connect(a.dsn, autocommit=True)
    x = db.execute
    x("CREATE TABLE ledger (id int PRIMARY KEY, v int)")
    x("SELECT fencing_protect('ledger', 'settlement')")
    x("SELECT fencing_advance('settlement', 10)")
    x("BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO ledger VALUES (1, 1); COMMIT")
    x("CREATE TABLE orders (id int PRIMARY KEY, v int)")
    x("SELECT fencing_protect('orders')")
    x("BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO orders VALUES (1, 1), (2, 2); DELETE FROM orders WHERE id = 2; COMMIT")
    x("CREATE TABLE broken (id int PRIMARY KEY, v int)")
    x("SELECT fencing_protect('broken', 'b')")
    x("ALTER TABLE broken ALTER COLUMN fence_token SET DEFAULT 5")  # the protection can no longer hold
    x("SELECT fencing_lease_acquire('short', '1 second')")
    live_token = x("SELECT fencing_lease_acquire('long', '10 minutes')").fetchone()[0]
    time.sleep(1.2)

    def stale(sql):
        try:
            x(sql)
            return "committed"
        except psycopg.Error as e:
            x("ROLLBACK")  # the multi-statement query failed inside its transaction
            return e.sqlstate

    print("-- Prometheus has scraped the exporter before the stale writes")
    q = a.prometheus + "/api/v1/query?query=" + urllib.parse.quote('pg_fencing_resource_rejected_writes{resource="settlement"}')
    base = wait_for(lambda: json.loads(get(q))["data"]["result"], 60)
    check("Prometheus has a sample of the resource's refused writes (0)", base and base[0]["value"][1] == "0", base)
    # Two scrapes of the baseline, so that increase() sees the step.
    time.sleep(2.5)

    print("-- stale writes")
    check("a stale write to ledger is refused (FT001)",
          stale("BEGIN; SET LOCAL pg_fencing.token = '5'; UPDATE ledger SET v = 2 WHERE id = 1; COMMIT") == "FT001")
    check("a second one too",
          stale("BEGIN; SET LOCAL pg_fencing.token = '9'; UPDATE ledger SET v = 3 WHERE id = 1; COMMIT") == "FT001")
    check("a stale write to a row of orders is refused (FT001)",
          stale("BEGIN; SET LOCAL pg_fencing.token = '15'; UPDATE orders SET v = 3 WHERE id = 1; COMMIT") == "FT001")

    print("-- the exporter's figures")
    s = samples(get(a.exporter))
    check("no error scraping (pg_exporter_last_scrape_error 0)", value(s, "pg_exporter_last_scrape_error") == 0,
          value(s, "pg_exporter_last_scrape_error"))
    loaded = [v for (n, ls), v in s.items() if n == "pg_exporter_user_queries_load_error"]
    check("the queries file loaded (pg_exporter_user_queries_load_error 0)", loaded == [0.0], loaded)
    for name, labels, want in (
            ("pg_fencing_resource_high_water", {"resource": "settlement"}, 10),
            # the INSERT and the fencing_advance before it (the view's own count)
            ("pg_fencing_resource_accepted_writes", {"resource": "settlement"},
             x("SELECT accepted FROM fencing_resources WHERE resource = 'settlement'").fetchone()[0]),
            ("pg_fencing_resource_rejected_writes", {"resource": "settlement"}, 2),
            ("pg_fencing_resource_last_rejected_token", {"resource": "settlement"}, 9),
            ("pg_fencing_resource_tables", {"resource": "settlement"}, 1),
            ("pg_fencing_protected_table_active", {"relation": "ledger", "mode": "resource"}, 1),
            ("pg_fencing_protected_table_active", {"relation": "broken", "resource": "b"}, 0),
            ("pg_fencing_protected_table_active", {"relation": "orders", "mode": "per-row"}, 1),
            ("pg_fencing_protected_table_rejected_writes", {"relation": "orders"}, 1),
            ("pg_fencing_protected_table_tombstones", {"relation": "orders"}, 1),
            ("pg_fencing_leases_live", {}, 1),
            ("pg_fencing_leases_expired", {}, 1),
            ("pg_fencing_locks_locks", {"state": "held"}, 0),
            ("pg_fencing_lock_service_problem", {}, 0),
            ("pg_fencing_lock_service_watches", {}, 0)):
        got = value(s, name, **labels)
        check(f"{name}{labels or ''} = {want}", got == want, got)
    ts = value(s, "pg_fencing_resource_last_rejection_timestamp_seconds", resource="settlement")
    check("the last rejection's time is now", ts is not None and abs(ts - time.time()) < 60, ts)

    print("-- the alerts Prometheus fires")

    def alerts():
        return json.loads(get(a.prometheus + "/api/v1/alerts"))["data"]["alerts"]

    def firing_stale():
        return [al for al in alerts() if al["labels"]["alertname"] == "PgFencingStaleWriteRefused"
                and al["state"] == "firing"]

    def on(fired):
        return {al["labels"].get("resource") or al["labels"].get("relation") for al in fired}
    wait_for(lambda: on(firing_stale()) == {"settlement", "orders"}, 60)
    fired = firing_stale()
    check("PgFencingStaleWriteRefused fires for the resource settlement and the table orders",
          on(fired) == {"settlement", "orders"},
          fired)
    now = alerts()
    inactive = [al for al in now if al["labels"]["alertname"] == "PgFencingProtectionInactive"]
    check("PgFencingProtectionInactive is raised (pending for its minute) for broken alone",
          [al["labels"]["relation"] for al in inactive] == ["broken"] and inactive[0]["state"] in ("pending", "firing"),
          inactive)
    expired = [al for al in now if al["labels"]["alertname"] == "PgFencingLeasesExpiredUnreleased"]
    check("PgFencingLeasesExpiredUnreleased is raised (pending) for the expired lease",
          len(expired) == 1 and expired[0]["state"] == "pending", expired)
    check("PgFencingLockServiceProblem is not raised",
          not [al for al in now if al["labels"]["alertname"] == "PgFencingLockServiceProblem"], now)
    x("SELECT fencing_lease_release(%s)", (live_token,))
    print(f"monitoring: {'FAILED' if FAILS else 'all checks passed'}")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
