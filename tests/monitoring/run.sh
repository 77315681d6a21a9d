#!/usr/bin/env bash
# The operators' side (issue 46): monitoring/prometheus_alerts.yml checked and unit-tested with
# promtool, then the real prometheus-postgres-exporter (Debian's 0.11) with
# monitoring/postgres_exporter_queries.yaml on 127.0.0.1:${EXPORTER_PORT_MON:-54561} scraping a
# throwaway PostgreSQL 15 on 127.0.0.1:${PGPORT_MONITORING:-54559} that preloads pg_fencing, and
# a Prometheus on 127.0.0.1:${PROMETHEUS_PORT_MON:-54563} scraping the exporter every second and
# evaluating the rules: tests/monitoring/check.py makes stale writes, an inactive protection and
# leases, and checks the exported figures and the alerts Prometheus fires.
#   tests/monitoring/run.sh          (pg_fencing's current build installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python
for cmd in promtool prometheus prometheus-postgres-exporter; do
    command -v "$cmd" >/dev/null || { echo "$cmd is missing: run scripts/setup.sh --test" >&2; exit 1; }
done
echo "-- promtool: the alert rules and their unit tests"
promtool check rules monitoring/prometheus_alerts.yml
(cd monitoring && promtool test rules prometheus_alerts_test.yml)
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_MONITORING:-54559}
EXPORTER_PORT=${EXPORTER_PORT_MON:-54561}
PROM_PORT=${PROMETHEUS_PORT_MON:-54563}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
echo "-- prometheus-postgres-exporter $(prometheus-postgres-exporter --version 2>&1 | awk 'NR==1 {print $3}') and Prometheus $(prometheus --version 2>&1 | awk 'NR==1 {print $3}')"
DATA_SOURCE_NAME="postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres?sslmode=disable" \
    prometheus-postgres-exporter --web.listen-address="127.0.0.1:$EXPORTER_PORT" \
    --extend.query-path="$PWD/monitoring/postgres_exporter_queries.yaml" \
    --disable-default-metrics --disable-settings-metrics >"$WORK/exporter.log" 2>&1 &
CHILD_PIDS="$CHILD_PIDS $!"
cat >"$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $PWD/monitoring/prometheus_alerts.yml
scrape_configs:
  - job_name: postgres
    static_configs:
      - targets: ['127.0.0.1:$EXPORTER_PORT']
YAML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
CHILD_PIDS="$CHILD_PIDS $!"
if ! "$PY" tests/monitoring/check.py --dsn "host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres" \
        --exporter "http://127.0.0.1:$EXPORTER_PORT/metrics" --prometheus "http://127.0.0.1:$PROM_PORT"; then
    echo "-- the exporter's log:"; tail -20 "$WORK/exporter.log"
    echo "-- Prometheus's log:"; tail -20 "$WORK/prometheus.log"
    exit 1
fi
