# A Citus cluster of a coordinator and two workers on loopback, for tests/citus/run.sh and
# bench/citus.sh (sourced; scripts/lib.sh and PGBIN, PostgreSQL 18's bin directory, first):
#   start_citus_cluster <port>   the coordinator on <port>, the workers on the two ports above;
#                                each preloads citus and pg_fencing and has both extensions
#                                (start_citus_node);
#                                sets WORK (KEEP_WORK=1 keeps it), BASE and NODES, and stops the
#                                nodes when the calling script exits.
start_citus_cluster() {
    CHILD_PIDS=""
    fresh_workdir
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK"
    BASE=$1
    NODES="coordinator worker1 worker2"
    trap stop_citus_cluster EXIT
    trap 'exit 130' INT TERM
    local i=0 n
    for n in $NODES; do
        start_citus_node "$n" $((BASE + i)) citus,pg_fencing
        i=$((i + 1))
    done
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$BASE" -U postgres \
        -c "SELECT citus_set_coordinator_host('127.0.0.1', $BASE)" \
        -c "SELECT citus_add_node('127.0.0.1', $((BASE + 1)))" \
        -c "SELECT citus_add_node('127.0.0.1', $((BASE + 2)))" >/dev/null
}

# start_citus_node <name> <port> <shared_preload_libraries>: a node in $WORK/<name> with citus
# (and pg_fencing when it is preloaded) created in its database; stopped with the cluster once
# its name is in NODES.
start_citus_node() {
    local n=$1 port=$2 preload=$3
    as_pg "$PGBIN/initdb" -D "$WORK/$n" -U postgres -A trust --no-sync >"$WORK/$n.initdb.log" 2>&1
    cat >>"$WORK/$n/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
fsync = off
shared_preload_libraries = '$preload'
max_prepared_transactions = 20
wal_level = logical
log_line_prefix = '%m [%p] %a: '
CONF
    pg_ctl_start "$WORK/$n" "$WORK/$n.log"
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -c "CREATE EXTENSION citus"
    case ",$preload," in
        *,pg_fencing,*) "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -c "CREATE EXTENSION pg_fencing" ;;
    esac
}

stop_citus_cluster() {
    local n
    for n in $NODES; do
        [ -f "$WORK/$n/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" -D "$WORK/$n" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
    done
    if [ -n "${WORK:-}" ] && [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; fi
}
