# Shared helpers for pg_fencing's scripts: a hermetic environment, the project's Python
# interpreter, a throwaway PostgreSQL cluster and a throwaway etcd, both on 127.0.0.1,
# non-default ports, under a temp dir, removed by cleanup (also on Ctrl-C).
# Source it; set WORK (temp dir) first or let fresh_workdir make one.
#
# Sourcing it keeps the calling script hermetic (docs/testing.md, "The environment"): every
# exported variable is dropped except those named in HERMETIC_KEEP (scripts/hermetic.sh), so
# services and clients (psql and libpq's PG* variables, etcdctl's ETCDCTL_*, Python's PYTHON*,
# cargo's build settings) see only what the scripts set. Every entry script sources
# scripts/hermetic.sh first and this file after; setup.sh does neither, because installing
# packages needs the machine's registry settings (PIP_*, apt's).

if [ -z "${PGF_HERMETIC:-}" ]; then
    echo "$0: source scripts/hermetic.sh \"\$@\" first thing, before scripts/lib.sh (docs/testing.md)" >&2
    exit 1
fi
PROJECT_ROOT=$(CDPATH='' cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# HERMETIC_KEEP (what survives) is defined in scripts/hermetic.sh; here it also drops what a
# parent entry script exported for its own services (its cluster's PGHOST, say).
source "$PROJECT_ROOT/scripts/hermetic.sh"

hermetic_env() {
    local v
    for v in $(compgen -e); do
        [[ $v =~ ^(PGF_HERMETIC|PWD|OLDPWD|SHLVL)$ || $v =~ $HERMETIC_KEEP ]] || unset "$v" 2>/dev/null || true
    done
    unset CDPATH
    export LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 ETCDCTL_API=3
}
hermetic_env

# The project's Python: a virtualenv made by `scripts/setup.sh --test` from tests/requirements.txt.
# Scripts run Python only as "$PY" (scripts/check-scripts.sh enforces it).
PY="$PROJECT_ROOT/.venv/bin/python"
need_python() {
    if ! [ -x "$PY" ]; then
        echo "$PY is missing: run scripts/setup.sh --test (it makes the project's virtualenv)" >&2
        exit 1
    fi
}

# PostgreSQL 18 for building and testing (PG18_HOME, PG18_BIN).
source "$(dirname "${BASH_SOURCE[0]}")/pg18.sh"
source "$(dirname "${BASH_SOURCE[0]}")/pkg-env.sh"  # apt_run, pkg_run: package managers in a clean environment
# The major the suites run against: PGF_PG_MAJOR=15 (Debian's, the default) or 18 (PG18_BIN,
# where scripts/test.sh's stage 4 installed the build for 18). Its bin directory goes first on
# PATH, so psql, pg_dump and pg_restore match the server.
case "${PGF_PG_MAJOR:-15}" in
    15) PGBIN=/usr/lib/postgresql/15/bin ;;
    18) PGBIN=$PG18_BIN ;;
    *) echo "PGF_PG_MAJOR=$PGF_PG_MAJOR: the suites run on 15 or 18" >&2; exit 2 ;;
esac
PG_MAJOR=${PGF_PG_MAJOR:-15}
# The shape of the tables a suite protects (docs/design.md, "The set-based shape"), PGF_SHAPE:
# `set-based` preloads the library, `row-trigger` sets pg_fencing.set_based_shape = off (the
# server may still preload it), unset leaves the suite's own choice. pg_start honours it; a suite
# that writes a cluster's conf itself appends `shape_conf` to it; `expect_shape` checks that the
# tables got that shape.
case "${PGF_SHAPE:-}" in
    ''|set-based|row-trigger) ;;
    *) echo "PGF_SHAPE=$PGF_SHAPE: set-based, row-trigger or unset" >&2; exit 2 ;;
esac
# First on PATH, and the other major's bin directory off it, wherever the caller had them.
_pgf_path=""
IFS=: read -ra _pgf_dirs <<<"$PATH"
for _pgf_d in "${_pgf_dirs[@]}"; do
    case "$_pgf_d" in /usr/lib/postgresql/15/bin|"$PG18_BIN") ;; *) _pgf_path+="${_pgf_path:+:}$_pgf_d" ;; esac
done
export PATH="$PGBIN${_pgf_path:+:$_pgf_path}"
unset _pgf_path _pgf_dirs _pgf_d
: "${PGPORT_TEST:=54329}"
: "${ETCD_CLIENT_PORT:=23790}"
: "${ETCD_PEER_PORT:=23800}"
: "${ZK_PORT:=24181}"
: "${REDIS_PORT:=24191}"

# Checks shared by the shell suites: `expect` prints ok/FAIL and sets fail=1 on a mismatch;
# `sqlstate_of PSQL-COMMAND...` runs it and prints the SQLSTATE it fails with, or "ok".
fail=0
expect() {  # expect <what> <expected> <actual>
    if [ "$2" = "$3" ]; then echo "  ok: $1 = $3"; else echo "  FAIL: $1: expected $2, got $3"; fail=1; fi
}
sqlstate_of() {
    local out
    if out=$("$@" -v VERBOSITY=verbose 2>&1); then echo ok; else echo "$out" | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' | head -1; fi
}

# wait_for <what> <expected> <port> <db> <sql>: polls the query for up to 30 s, then `expect`s.
wait_for() {
    local got=""
    for _ in $(seq 1 300); do
        got=$(psql -X -q -p "$3" -d "$4" -Atc "$5" 2>/dev/null || true)
        [ "$got" = "$2" ] && break
        sleep 0.1
    done
    expect "$1" "$2" "$got"
}

# shape_conf [CONF]: the postgresql.conf lines to append after CONF (the suite's own lines) for
# PGF_SHAPE; nothing if it is unset or CONF already says so. set-based adds pg_fencing to CONF's
# shared_preload_libraries (its last line, as the server reads it), keeping what else it names.
shape_conf() {
    local conf=${1:-} libs
    libs=$(printf '%s\n' "$conf" | sed -n "s/^[[:space:]]*shared_preload_libraries[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" | tail -1)
    case "${PGF_SHAPE:-}" in
        set-based)
            # set_based_shape: the last line wins, so an "off" in CONF is overridden too.
            if ! [[ ,${libs// /}, == *,pg_fencing,* ]]; then
                echo "shared_preload_libraries = '${libs:+$libs,}pg_fencing'"
            fi
            if printf '%s\n' "$conf" | grep -q '^[[:space:]]*pg_fencing\.set_based_shape'; then
                echo "pg_fencing.set_based_shape = on"
            fi ;;
        row-trigger)
            printf '%s\n' "$conf" | grep -q "^pg_fencing.set_based_shape = off$" || echo "pg_fencing.set_based_shape = off" ;;
    esac
}

# expect_shape [--except NAME[,NAME...]] [psql arguments...]: with PGF_SHAPE set, every protected
# plain table (relkind 'r') of the database the psql arguments name reports that shape in
# fencing_protected_tables, and there is at least one (else FAIL, and fail=1); tables named in
# --except (relnames: a table the shape cannot have, such as a per-row table whose key is
# identified by hash) are left out. Without PGF_SHAPE it prints the shapes it sees.
expect_shape() {
    local except="" got where want
    if [ "${1:-}" = --except ]; then except=$2; shift 2; fi
    got=$(psql -X -q -v ON_ERROR_STOP=1 -At "$@" -c "SELECT 'database ' || current_database() || ' on port ' || current_setting('port'),
            coalesce(string_agg(c.relname || '=' || t.shape, ',' ORDER BY c.relname), 'none')
        FROM fencing_protected_tables t JOIN pg_class c ON c.oid = t.relation
        WHERE c.relkind = 'r' AND NOT c.relname = ANY (string_to_array('$except', ','))")
    where=${got%%|*}
    got=${got#*|}
    if [ -z "${PGF_SHAPE:-}" ]; then
        echo "  (shapes of the protected tables, $where: $got)"
        return 0
    fi
    want=$(printf '%s\n' "$got" | tr ',' '\n' | sed "s/=.*/=$PGF_SHAPE/" | paste -sd,)
    if [ "$got" != none ] && [ "$got" = "$want" ]; then
        echo "  ok: every protected plain table has the $PGF_SHAPE shape, $where: $got"
    else
        echo "  FAIL: PGF_SHAPE=$PGF_SHAPE, but the protected plain tables of $where have: $got"
        fail=1
    fi
}

fresh_workdir() {
    WORK=$(mktemp -d /tmp/pg_fencing.XXXXXX)
    chmod 755 "$WORK"
}

# Run a command as the postgres OS user when we are root (PostgreSQL refuses to run as root).
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        sudo -u postgres -- "$@"
    else
        "$@"
    fi
}

# port_free <port>: waits up to 30 s until nothing listens on the TCP port (a server a previous
# suite stopped may still be closing it); if something still does, says what.
port_free() {
    for _ in $(seq 1 300); do
        [ -z "$(ss -Hltn "sport = :$1")" ] && return 0
        sleep 0.1
    done
    echo "port $1 is still in use after 30 s:" >&2
    ss -ltnp "sport = :$1" >&2 || true
    return 1
}

# pg_ctl_start <datadir> <log> [timeout in s, 60]: starts the cluster once its port is free; if
# it does not start, prints the end of its log (and what holds its port) and fails.
pg_ctl_start() {
    local port
    port=$(sed -n 's/^port = \([0-9]*\).*/\1/p' "$1/postgresql.conf" | tail -1)
    [ -z "$port" ] || port_free "$port" || true
    if ! as_pg "$PGBIN/pg_ctl" -D "$1" -l "$2" -w -t "${3:-60}" start >/dev/null; then
        echo "FAIL: PostgreSQL in $1 did not start; the end of $2:" >&2
        tail -20 "$2" >&2 || true
        return 1
    fi
}

pg_start() {
    PGDATA_TEST="$WORK/pgdata"
    mkdir -p "$PGDATA_TEST"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$PGDATA_TEST" "$WORK"
    as_pg "$PGBIN/initdb" -D "$PGDATA_TEST" -U postgres -A trust --no-sync >"$WORK/initdb.log" 2>&1
    cat >>"$PGDATA_TEST/postgresql.conf" <<CONF
port = $PGPORT_TEST
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
fsync = off
${PG_EXTRA_CONF:-}
$(shape_conf "${PG_EXTRA_CONF:-}")
CONF
    pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log"
    export PGHOST=127.0.0.1 PGPORT=$PGPORT_TEST PGUSER=postgres PGDATABASE=postgres
    if [ -n "${PGF_PG_MAJOR:-}" ]; then
        echo "  (PostgreSQL $(psql -X -Atc 'SHOW server_version') from $PGBIN on 127.0.0.1:$PGPORT_TEST)"
    fi
}

pg_stop() {
    if [ -n "${PGDATA_TEST:-}" ] && [ -f "$PGDATA_TEST/postmaster.pid" ]; then
        # A server that does not stop would keep its port from the next suite: say so.
        if ! as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m immediate -w -t 60 stop >/dev/null 2>&1; then
            local pid
            pid=$(head -1 "$PGDATA_TEST/postmaster.pid" 2>/dev/null || true)
            if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                echo "WARNING: the PostgreSQL server in $PGDATA_TEST (pid $pid) did not stop within 60 s" >&2
            fi
        fi
    fi
}

etcd_start() {
    mkdir -p "$WORK/etcd"
    etcd --name pgf --data-dir "$WORK/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "pgf=http://127.0.0.1:$ETCD_PEER_PORT" \
        >"$WORK/etcd.log" 2>&1 &
    ETCD_PID=$!
    export ETCDCTL_ENDPOINTS="127.0.0.1:$ETCD_CLIENT_PORT"
    for _ in $(seq 1 100); do
        etcdctl endpoint health >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "etcd did not start; see $WORK/etcd.log" >&2
    return 1
}

etcd_stop() {
    if [ -n "${ETCD_PID:-}" ]; then
        kill "$ETCD_PID" 2>/dev/null || true
        wait "$ETCD_PID" 2>/dev/null || true
        ETCD_PID=""
    fi
}

# etcd_holder <name> <lock>: takes etcd lock <lock> with `etcdctl lock` in the background, in a
# process group of its own (setsid; its pid in $WORK/<name>.pid and in CHILD_PIDS). Its output
# goes to $WORK/<name>.out.
etcd_holder() {
    setsid etcdctl lock "$2" -- sleep 600 >"$WORK/$1.out" 2>&1 &
    CHILD_PIDS="${CHILD_PIDS:-} $!"
    echo "$!" >"$WORK/$1.pid"
}
# wait_lock_owner <lock> [previous revision]: waits up to 10 s until a key other than the one of
# that revision holds the lock; prints the create revision of the key holding it (the lowest),
# or nothing.
wait_lock_owner() {
    local rev=""
    for _ in $(seq 1 100); do
        rev=$(etcdctl get --prefix "$1/" -w fields 2>/dev/null | sed -n 's/^"CreateRevision" : //p' | sort -n | sed -n 1p)
        [ -n "$rev" ] && [ "$rev" != "${2:-}" ] && break
        sleep 0.1
    done
    echo "$rev"
}

# zk_start: a throwaway standalone ZooKeeper (Debian's zookeeper package) on
# 127.0.0.1:$ZK_PORT, data under $WORK/zk; tickTime 500 ms, so session timeouts of 1 to 10 s.
# Stopped by cleanup_all.
zk_start() {
    mkdir -p "$WORK/zk"
    cat >"$WORK/zoo.cfg" <<CFG
tickTime=500
dataDir=$WORK/zk
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok
CFG
    java -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.server.ZooKeeperServerMain "$WORK/zoo.cfg" \
        >"$WORK/zk.log" 2>&1 &
    ZK_PID=$!
    for _ in $(seq 1 150); do zk_ok && return 0; sleep 0.2; done
    echo "ZooKeeper did not start; see $WORK/zk.log" >&2
    tail -20 "$WORK/zk.log" >&2
    return 1
}
zk_ok() { [ "$( (exec 3<>"/dev/tcp/127.0.0.1/$ZK_PORT" && printf ruok >&3 && head -c4 <&3) 2>/dev/null)" = imok ]; }

# redis_start: a throwaway Redis on 127.0.0.1:$REDIS_PORT, nothing saved. Stopped by cleanup_all.
redis_start() {
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
        >"$WORK/redis.log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 1 100); do
        [ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.1
    done
    echo "Redis did not start; see $WORK/redis.log" >&2
    return 1
}

cleanup_all() {
    # Resume anything we froze, so it can exit, then stop everything we started.
    for p in ${CHILD_PIDS:-}; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
    etcd_stop
    for v in ZK_PID REDIS_PID; do
        if [ -n "${!v:-}" ]; then kill "${!v}" 2>/dev/null || true; wait "${!v}" 2>/dev/null || true; fi
    done
    pg_stop
    if [ -n "${WORK:-}" ] && [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; fi
}
