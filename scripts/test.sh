#!/usr/bin/env bash
# Runs every test of pg_fencing: installs what is missing (scripts/setup.sh --test), then checks
# that it runs hermetically (docs/testing.md, "The environment"): scripts/hermetic.sh drops the
# caller's environment but for what it names, a bare python3 (no third-party packages) goes first
# on PATH so that a script using any Python but the project's virtualenv fails on every machine,
# and scripts/check-scripts.sh reads the scripts for the same rules. Then
#   1. unit tests and #[pg_test] tests   (cargo pgrx test pg15, in pgrx's own test cluster)
#   2. pg_regress suite                   (tests/pg_regress, against a throwaway cluster), bypass hunter (tests/bypass)
#   3. isolation specs                    (tests/isolation, concurrent interleavings); PostgreSQL
#                                          leases under concurrency (tests/leases)
#   4. PostgreSQL 18                      (cargo pgrx test pg18 and the release tarball for 18, built
#                                          in the background while 5-17 run; at 18: the tarball
#                                          installed, pg_regress and isolation on 18.6; the CloudNativePG
#                                          extension image mounted as an image volume, tests/image;
#                                          the PGXN archive installed with pgxn install, tests/pgxn)
#   5. the zombie-client demo as a check  (scripts/demo.sh with the real etcd and etcdctl lock; then
#                                          with ZooKeeper's lock recipe, a Redis lock and PostgreSQL
#                                          leases)
#   6. randomized stress test             (tests/stress, 16 clients, independent checker)
#   7. crash under load                   (tests/stress --crash: kill -9 of the postmaster)
#   8. negative control                   (tests/stress --unfenced must be caught)
#   9. streaming standby and promotion    (tests/replication; in both table shapes)
#  10. background worker with real etcd   (tests/worker/run.sh)
#  11. pooler safety through pgbouncer    (tests/pooler, transaction mode)
#  12. upgrade from released versions     (tests/upgrade, ALTER EXTENSION UPDATE; released scripts unedited)
#  13. observability                      (tests/observability: rejection log, views, pg_stat_statements;
#                                          tests/monitoring: the exporter's queries and alert rules)
#  14. the client examples                (examples/rust-client and examples/go-client against real
#                                          etcd, tests/client; ZooKeeper with kazoo and Curator,
#                                          tests/zookeeper; Redis tokens across a failover,
#                                          tests/redis;
#                                          job queues pgqueuer, procrastinate, pg-boss and
#                                          graphile-worker with PostgreSQL leases, tests/jobqueue;
#                                          the Python package pg-fencing, tests/pyclient; the
#                                          Node package pg-fencing, tests/nodeclient; the Go
#                                          module pgfencing, tests/goclient; the Rust crate
#                                          pg-fencing, tests/rustclient)
#  15. fuzz targets                       (fuzz/, cargo +nightly fuzz, 20 s each)
#  16. lifecycle paths                    (tests/lifecycle: asynchronous commit; a watch carried by
#                                          pg_dump/restore, promotion and pg_upgrade, and from
#                                          0.1.0 through ALTER EXTENSION UPDATE; lease tokens that
#                                          never go back; logical replication and backup and
#                                          restore, in both table shapes)
#  17. network partitions                 (tests/partition: three etcd members and PostgreSQL in
#                                          network namespaces, randomized faults, 150 s, checked by
#                                          tests/stress's checker; and its negative control)
#  18. the suites on PostgreSQL 18        (PGF_PG_MAJOR=18: stages 6-13, 16, the leases and the Python,
#                                          Node and Rust packages again; then a cluster
#                                          carried from 15 to 18, tests/lifecycle/major_upgrade.sh;
#                                          standby, logical, restore, major_upgrade in both shapes)
#  19. the Debian package removed         (apt-get remove; none of its files left)
# Between 1 and 2 the Debian package (scripts/package.sh 15) is installed with apt-get install,
# as docs/operations.md "Install" says, so the suites test what users install.
# Usage: scripts/test.sh [--no-setup] [--quick | --only STAGE[,STAGE...]] [--list]
#   (no option)   every stage above, after scripts/setup.sh --test: the test command (README.md)
#   --quick       checks, unit, install, regress, isolation: the edit-test loop once built
#   --only ...    the named stages (--list shows them), against the build installed now (the
#                 stage `install` puts the current release build in place); no setup.
#                 `pg18_build`: stage 4's builds alone (cargo pgrx test pg18, the tarball for 18),
#                 what the test command runs in the background
set -euo pipefail
# Setup runs with the caller's environment (apt, pip and cargo need the machine's registry
# settings); everything after it is hermetic.
# What setup or the install stage replaces in the system PostgreSQL, it keeps and names
# (scripts/system-install.sh); the note is repeated at the end if this run replaced it
# (target/.test-started: when this run began, also for --quick and --only).
if [ -z "${PGF_HERMETIC:-}" ]; then
    mkdir -p "$(dirname "$0")/../target" && touch "$(dirname "$0")/../target/.test-started"
fi
if [ -z "${PGF_HERMETIC:-}" ] && [ $# -eq 0 ]; then
    # --no-build: stage 1 builds and installs its test build and the package stage the release
    # build (setup's own build, a third one, took about 4 minutes of a clean clone's run).
    "$(dirname "$0")/setup.sh" --test --no-build
    set -- --no-setup
fi
source "$(dirname "$0")/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
ROOT=$(pwd)
source scripts/lib.sh
STAGE="setup and the checks before stage 1"
step() { STAGE=$*; printf '\n\033[1m== [%5ss] %s\033[0m\n' "$SECONDS" "$*"; }

# The options, before anything is started (a bad one only prints the usage).
ALL_STAGES="checks unit package regress bypass isolation leases pg18 demo stress crash unfenced standby
            worker pooler upgrade observability clients fuzz lifecycle partition pg18_suites remove"
QUICK_STAGES="checks unit install regress isolation"
STAGES=$ALL_STAGES
while [ $# -gt 0 ]; do
    case "$1" in
        --no-setup) shift ;;
        --quick) STAGES=$QUICK_STAGES; shift ;;
        --only) [ $# -ge 2 ] || { echo "--only needs a list of stages (--list shows them)" >&2; exit 2; }
                STAGES=$(echo "$2" | tr ',-' ' _'); shift 2 ;;
        --list) echo "stages: $(echo $ALL_STAGES) install"; echo "--quick: $QUICK_STAGES"; exit 0 ;;
        -h|--help) sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown option $1 (usage: scripts/test.sh [--no-setup] [--quick | --only STAGE[,STAGE...]] [--list])" >&2; exit 2 ;;
    esac
done
need_python   # after the options: --list and --help work before setup made .venv
CHILD_PIDS=""
fresh_workdir
# The suites listen on fixed ports (docs/testing.md) inside Linux's ephemeral range, where an
# outgoing connection of another suite can hold one (a standby failed "Address already in use" on
# 54420 once). As root, keep those ranges out of the ephemeral ports (best effort: a container
# may not allow it).
if [ "$(id -u)" -eq 0 ] && [ -w /proc/sys/net/ipv4/ip_local_reserved_ports ]; then
    echo 23700-24400,54300-54500 >/proc/sys/net/ipv4/ip_local_reserved_ports 2>/dev/null || true
fi
# A failing stage is named at the end of the output (set -e stops at the first failing command).
trap 'rc=$?; [ "$rc" -eq 0 ] || printf "\nFAILED (exit status %s) in: %s\n" "$rc" "$STAGE" >&2; pg18_build_stop; cleanup_all' EXIT
trap 'exit 130' INT TERM
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
DEB_NAME=postgresql-15-pg-fencing
DEB="$ROOT/target/packages/${DEB_NAME}_${VERSION}_amd64.deb"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

stage_checks() {
    step "hermetic: the project's Python only, the caller's environment dropped (scripts/check-scripts.sh)"
    # A fresh machine's python3 has no psycopg2; make every machine look like that: a bare virtualenv
    # (no pip, no packages) first on PATH for everything below.
    /usr/bin/python3 -I -m venv --without-pip "$WORK/bare-python"  # other python: the bare one
    export PATH="$WORK/bare-python/bin:$PATH"
    if python3 -c 'import psycopg2' 2>/dev/null; then  # other python: checks the bare one
        echo "FAIL: the bare python3 first on PATH ($(command -v python3)) imports psycopg2" >&2  # other python: text
        exit 1
    fi
    echo "  python3 on PATH: $(command -v python3) (bare); the project's: $PY"  # other python: text
    scripts/check-scripts.sh --self-test
    scripts/check-scripts.sh

    if cargo fmt --version >/dev/null 2>&1; then
        step "formatting (cargo fmt --check)"
        cargo fmt --check
    else
        step "formatting: skipped (rustfmt is not installed: rustup component add rustfmt)"
    fi

    step "structure: layers without import cycles and per-backend state listed (scripts/check_layers.py), the SQL surface against the code (scripts/check_sql_surface.py), clippy (documented unsafe), documents' links (scripts/check-docs.sh)"
    "$PY" scripts/check_layers.py src
    "$PY" scripts/check_sql_surface.py --self-test
    "$PY" scripts/check_sql_surface.py   # the SQL scripts' C functions against the Rust entry points
    cargo clippy -- -D warnings   # the library as built for release
    cargo clippy --features "pg15 pg_test" --tests -- -D warnings
    CARGO_TARGET_DIR=target/pg18 cargo clippy --no-default-features --features pg18 -- -D warnings  # PostgreSQL 18's build
    scripts/check-docs.sh --strict

    step "released SQL scripts unchanged (scripts/check-sql-releases.sh); what setup replaces in the system PostgreSQL is kept and named (tests/setup/replaced_install.sh)"
    scripts/check-sql-releases.sh
    tests/setup/replaced_install.sh
}

stage_unit() {
    step "1/19 unit and #[pg_test] tests (cargo test in fencing-core, cargo pgrx test pg15)"
    (cd fencing-core && cargo test -q 2>&1 | grep -E "^test result|FAILED|panicked")
    mkdir -p "$WORK/pgrx-data"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK/pgrx-data"
    if [ "$(id -u)" -eq 0 ]; then
        cargo pgrx test pg15 --runas postgres --pgdata "$WORK/pgrx-data"
    else
        cargo pgrx test pg15
    fi
}

# cargo pgrx test installs its own build (with the #[pg_test] functions) into the system
# PostgreSQL; the test command puts the release package in its place, installed the way
# docs/operations.md "Install" says: the Debian package, by apt-get (scripts/package.sh builds it).
stage_package() {
    step "packaging: the Debian package for 15 (scripts/package.sh 15), installed with apt-get install"
    rm -f "$DEB"
    scripts/package.sh 15
    dpkg-deb --info "$DEB" | sed -n 's/^ \(Package\|Version\|Depends\|Installed-Size\):/  \1:/p'
    # --reinstall: a previous run may have left the package installed, and cargo pgrx test has just
    # written its own build over the package's files.
    apt_run apt-get install -y -qq -o DPkg::Lock::Timeout=300 --reinstall "$DEB" >"$WORK/apt-install.log" 2>&1 \
        || { cat "$WORK/apt-install.log"; exit 1; }
    dpkg-query -W -f='  installed: ${Package} ${Version} (${db:Status-Abbrev})\n' "$DEB_NAME"
    dpkg -L "$DEB_NAME" | sort >"$WORK/deb-files.txt"
    for f in "/usr/lib/postgresql/15/lib/pg_fencing.so" \
             "/usr/share/postgresql/15/extension/pg_fencing.control" \
             "/usr/share/postgresql/15/extension/pg_fencing--$VERSION.sql" \
             $(cd sql && ls pg_fencing--*--*.sql | sed 's|^|/usr/share/postgresql/15/extension/|') \
             "/usr/share/doc/$DEB_NAME/copyright" "/usr/share/doc/$DEB_NAME/README.md.gz"; do
        grep -qxF "$f" "$WORK/deb-files.txt" || { echo "FAIL: the package lacks $f" >&2; exit 1; }
    done
    # Every installed file as the package has it (its md5sums); then the library is the release build's,
    # stripped as Debian's tools do.
    # (dpkg --verify exits 0 either way; a line per differing file is what tells.)
    verify=$(dpkg --verify "$DEB_NAME" 2>&1 || true)
    [ -z "$verify" ] || { echo "FAIL: dpkg --verify $DEB_NAME: files differ from the package:" >&2; echo "$verify" >&2; exit 1; }
    strip --strip-unneeded -o "$WORK/stripped.so" target/release/pg_fencing-pg15/usr/lib/postgresql/15/lib/pg_fencing.so
    cmp "$WORK/stripped.so" "$($PGBIN/pg_config --pkglibdir)/pg_fencing.so"
    grep -q "default_version = '$VERSION'" "$($PGBIN/pg_config --sharedir)/extension/pg_fencing.control"
    echo "  installed pg_fencing $VERSION from $(basename "$DEB"); dpkg -L lists $(grep -c . "$WORK/deb-files.txt") paths"
}

# The edit-test loop's install (--quick, --only install): the release build of the working tree
# into PostgreSQL 15 as the test command leaves it at the end, each file unlinked and written anew
# (a server that has the old library loaded keeps its copy).
stage_install() {
    step "install: the working tree's release build into PostgreSQL 15 (cargo pgrx package, files copied in place)"
    cargo pgrx package --pg-config "$PGBIN/pg_config" >"$WORK/install.log" 2>&1 || { tail -30 "$WORK/install.log"; exit 1; }
    $SUDO cp -r --remove-destination target/release/pg_fencing-pg15/usr/. /usr/
}

# pg_regress and the isolation specs each run in a throwaway cluster that preloads the library
# (the #[pg_test] cluster runs without preloading, so both ways are tested; the statistics need
# it): tests/pg_regress/run.sh, tests/isolation/run.sh, the same commands a contributor runs.
stage_regress() {
    step "2/19 pg_regress (tests/pg_regress)"
    tests/pg_regress/run.sh
}

stage_bypass() {
    step "2/19 the bypass hunter (tests/bypass): token sources x write paths x protection states against a model of the contract"
    tests/bypass/run.sh --seed 1 --sequences 60 --steps 60
}

stage_isolation() {
    step "3/19 isolation specs (tests/isolation, PostgreSQL's pg_isolation_regress)"
    tests/isolation/run.sh
}

stage_leases() {
    step "3/19 PostgreSQL leases under concurrency: waking, timeouts, renewal elsewhere, NOTIFY, independent checker and its negative control (tests/leases)"
    tests/leases/run.sh
}

# PostgreSQL 18's builds, built into their own target directory so that the builds for 15 stay as
# they are: the #[pg_test] tests (cargo pgrx test pg18, which builds and runs them), then the
# release tarball (scripts/package.sh 18). Its build has no ICU: tombstone_equality_icu skips
# itself there (its alternative output, tombstone_equality_icu_1.out).
stage_pg18_build() {
    step "4/19 PostgreSQL 18: #[pg_test] tests (cargo pgrx test pg18) and the release tarball for 18 (scripts/package.sh 18)"
    mkdir -p "$WORK/pgrx-data-18"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK/pgrx-data-18"
    if [ "$(id -u)" -eq 0 ]; then
        CARGO_TARGET_DIR=target/pg18 cargo pgrx test pg18 --no-default-features --runas postgres --pgdata "$WORK/pgrx-data-18"
    else
        CARGO_TARGET_DIR=target/pg18 cargo pgrx test pg18 --no-default-features
    fi
    rm -f "target/packages/pg_fencing-$VERSION-pg18.tar.gz"
    scripts/package.sh 18
}

# These builds take both cores for about ten minutes, while the suites on 15 that follow them
# mostly wait (on etcd's TTLs, restarts, network faults). So a run with the stages pg18 and
# pg18_suites (the test command) starts them in the background when it reaches stage pg18, at
# the lowest CPU and I/O priority (nice 19, ionice best-effort 7: the suites keep the cores they
# ask for), in a session of their own (stopped with the run), their output in
# $WORK/pg18-build.log; stage 18 waits for them, then installs and tests what they built
# (pg18_installed). Alone (--only pg18) the stage builds in the foreground.
PG18_BUILD_PID=""
pg18_build_stop() {
    if [ -n "$PG18_BUILD_PID" ]; then kill -- "-$PG18_BUILD_PID" 2>/dev/null || true; PG18_BUILD_PID=""; fi
}
stage_pg18() {
    case " $(echo $STAGES) " in
        *" pg18_suites "*)
            step "4/19 PostgreSQL 18: its builds and #[pg_test] tests started in the background (cargo pgrx test pg18, scripts/package.sh 18; log \$WORK/pg18-build.log); stage 18 waits for them, installs the tarball and tests it"
            setsid nice -n 19 ionice -c 2 -n 7 "$ROOT/scripts/test.sh" --only pg18_build >"$WORK/pg18-build.log" 2>&1 &
            PG18_BUILD_PID=$!
            echo "  started (pid $PG18_BUILD_PID)"
            return ;;
    esac
    stage_pg18_build
    pg18_installed
}

# Waits for the background builds of stage pg18; their output as a summary, all of it on failure.
pg18_build_wait() {
    step "4/19 PostgreSQL 18 (continued): the background builds' result (cargo pgrx test pg18, scripts/package.sh 18)"
    local status=0
    wait "$PG18_BUILD_PID" || status=$?
    PG18_BUILD_PID=""
    if [ "$status" -ne 0 ]; then
        sed 's/\x1b\[[0-9;]*m//g' "$WORK/pg18-build.log" | tail -150
        echo "FAIL: the PostgreSQL 18 builds (stage pg18, in the background) exited with status $status" >&2
        exit 1
    fi
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/pg18-build.log" | grep -E "^== \[|^test result|^  installed|tarball|passed|failed" | sed 's/^/  | /' | tail -30
}

# The release tarball for 18 installed and tested: pg_regress and the isolation specs on 18.6;
# the CloudNativePG extension image (scripts/package.sh image) mounted as an image volume,
# pg_regress against it (tests/image); the PGXN archive validated and installed into 18 with
# pgxn install (tests/pgxn).
pg18_installed() {
    step "4/19 PostgreSQL 18: the release tarball for 18 installed, pg_regress and isolation specs on 18.6; the CloudNativePG extension image (scripts/package.sh image) mounted as an image volume, pg_regress against it (tests/image); the PGXN archive validated and installed into 18 with pgxn install (tests/pgxn)"
    # cargo pgrx test installed its test build into 18; the release tarball replaces it, installed
    # as docs/operations.md says for a server whose paths are not Debian's: the library into
    # `pg_config --pkglibdir`, the rest into `pg_config --sharedir`/extension, each by a new file
    # renamed over the old one.
    TARBALL="target/packages/pg_fencing-$VERSION-pg18.tar.gz"
    mkdir -p "$WORK/tar18"
    tar -C "$WORK/tar18" -xzf "$TARBALL"
    (cd "$WORK/tar18" && find . -type f | sort) | sed 's/^/  /'
    LIB18=$("$PG18_BIN/pg_config" --pkglibdir)
    EXT18="$("$PG18_BIN/pg_config" --sharedir)/extension"
    for f in "$WORK"/tar18/usr/lib/postgresql/18/lib/* "$WORK"/tar18/usr/share/postgresql/18/extension/*; do
        case "$f" in *.so) dest=$LIB18 ;; *) dest=$EXT18 ;; esac
        cp "$f" "$dest/.$(basename "$f").new" && mv -f "$dest/.$(basename "$f").new" "$dest/$(basename "$f")"
    done
    cmp "$WORK/tar18/usr/lib/postgresql/18/lib/pg_fencing.so" "$LIB18/pg_fencing.so"
    echo "  installed pg_fencing $VERSION for $("$PG18_BIN/pg_config" --version) from $TARBALL"
    PGF_PG_MAJOR=18 tests/pg_regress/run.sh
    PGF_PG_MAJOR=18 tests/isolation/run.sh
    # The CloudNativePG extension image (the same build), mounted into 18 as an image volume.
    scripts/package.sh image
    tests/image/run.sh
    # PGXN: the archive PGXN takes, validated, and installed into 18 by PGXN's client.
    scripts/package.sh pgxn
    tests/pgxn/run.sh
}

stage_demo() {
    step "5/19 zombie-client demo with a real etcd (scripts/demo.sh), then with ZooKeeper, with Redis and with PostgreSQL leases (--lock-service)"
    ./scripts/demo.sh --no-setup
    ./scripts/demo.sh --no-setup --lock-service zookeeper
    ./scripts/demo.sh --no-setup --lock-service redis
    ./scripts/demo.sh --no-setup --lock-service postgres
}

stage_stress() {
    step "6/19 randomized stress test, 16 clients, tombstones pruned during the load, checked by an independent checker (tests/stress)"
    tests/stress/run.sh --clients 16 --writes 10000 --seconds 300 --seed 1 --prune
    step "6/19 the same in the row-trigger shape (tests/stress --shape row-trigger)"
    tests/stress/run.sh --clients 16 --writes 5000 --seconds 300 --seed 4 --prune --shape row-trigger
}

stage_crash() {
    step "7/19 crash: kill -9 of the postmaster under the stress load, restart, check (tests/stress --crash)"
    tests/stress/run.sh --clients 16 --writes 8000 --seconds 300 --seed 2 --crash
    step "7/19 the same in the row-trigger shape (tests/stress --crash --shape row-trigger)"
    tests/stress/run.sh --clients 16 --writes 4000 --seconds 300 --seed 5 --crash --shape row-trigger
}

# The stress checker's negative control: with the guard switched off it must report violations.
stress_unfenced() {
    local out
    if out=$(tests/stress/run.sh --clients 16 --writes 2000 --seconds 120 --seed 3 --unfenced 2>&1); then
        echo "$out" | tail -15
        echo "FAIL: the checker found no violation in an unfenced run" >&2
        exit 1
    fi
    echo "$out" | grep -m3 "VIOLATION" || { echo "$out" | tail -15; echo "FAIL: unfenced run failed without a VIOLATION" >&2; exit 1; }
    echo "  (expected: the checker reports violations when the guard is off)"
}
stage_unfenced() {
    step "8/19 negative control: the same checker must catch violations when fencing is switched off"
    stress_unfenced
}

stage_standby() {
    for shape in set-based row-trigger; do
        step "9/19 streaming standby and promotion, $shape shape (tests/replication, PGF_SHAPE=$shape)"
        PGF_SHAPE=$shape tests/replication/standby.sh
    done
}

stage_worker() {
    step "10/19 background worker with real etcd: interop, timeouts, lease loss, etcd down, crash, 3-member cluster, TLS, auth, grpc-proxy, many locks"
    tests/worker/run.sh
}

stage_pooler() {
    step "11/19 pooler safety: a token never reaches the next client of a transaction-mode pgbouncer (tests/pooler)"
    tests/pooler/run.sh
}

stage_upgrade() {
    step "12/19 upgrade: ALTER EXTENSION pg_fencing UPDATE from every released version; released scripts never edited (tests/upgrade)"
    tests/upgrade/run.sh
}

stage_observability() {
    step "13/19 observability: one log line per refused write, views, pg_stat_statements (tests/observability)"
    tests/observability/run.sh
    step "13/19 monitoring: the exporter's queries through the real prometheus-postgres-exporter, the alert rules in promtool and a real Prometheus (tests/monitoring)"
    tests/monitoring/run.sh
}

stage_clients() {
    step "14/19 the client examples against real etcd: Rust (etcd-client + tokio-postgres) and Go (etcd concurrency + pgx) (tests/client); ZooKeeper's lock recipe with kazoo and Curator (tests/zookeeper)"
    for client in rust go; do
        tests/client/run.sh --client "$client"
        # Negative control: without fencing_protect the same scenario must let the zombie's write land.
        if out=$(tests/client/run.sh --client "$client" --unfenced 2>&1); then
            echo "$out" | tail -15
            echo "FAIL: the $client client test passed with fencing switched off; its checks cannot fail" >&2
            exit 1
        fi
        echo "$out" | grep -m2 "FAIL" | sed "s/^/  $client, expected with --unfenced: /"
    done
    tests/zookeeper/run.sh
    step "14/19 Redis fencing tokens (INCR beside the lock, as Redisson's): ordered without a failover, the same token for two holders after one (tests/redis)"
    tests/redis/run.sh
    step "14/19 zombie job workers in real job queues with PostgreSQL leases: pgqueuer and procrastinate (PyPI), pg-boss and graphile-worker (npm), each with its negative control (tests/jobqueue)"
    tests/jobqueue/run.sh
    step "14/19 the Python package pg-fencing (clients/): its wheel installed from the artifact; psycopg 3, psycopg2, asyncpg, leases (tests/pyclient)"
    tests/pyclient/run.sh
    step "14/19 the Node package pg-fencing (clients/node): its npm tarball installed; node-postgres client and pool, Drizzle ORM, leases (tests/nodeclient)"
    tests/nodeclient/run.sh
    step "14/19 the Go module pgfencing (clients/go): pgx v4 and its pool, database/sql with lib/pq, etcd 3.4 locks, leases (tests/goclient)"
    tests/goclient/run.sh
    step "14/19 the Rust crate pg-fencing (clients/rust): its .crate from cargo package, unpacked and tested; tokio-postgres, sqlx, leases, etcd lock tokens (tests/rustclient)"
    tests/rustclient/run.sh
}

stage_fuzz() {
    step "15/19 fuzz targets: token parsing and the fenced_* jsonb shape check (cargo +nightly fuzz, 20 s each)"
    for target in token_parse json_shape; do
        corpus="$WORK/fuzz-$target"
        mkdir -p "$corpus"
        # New inputs go to the first (temporary) corpus; the committed seeds are only read.
        if ! cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$corpus" "fuzz/corpus/$target" -- \
                -max_total_time=20 -print_final_stats=1 >"$WORK/fuzz-$target.log" 2>&1; then
            tail -40 "$WORK/fuzz-$target.log"
            echo "FAIL: fuzz target $target (log above; the crashing input is under fuzz/artifacts/$target)" >&2
            exit 1
        fi
        grep -E "^(Done|stat::number_of_executed_units)" "$WORK/fuzz-$target.log" | sed "s/^/  $target: /"
    done
}

stage_lifecycle() {
    step "16/19 lifecycle paths: a mark raised by fencing_advance survives a crash under synchronous_commit = off (tests/lifecycle)"
    tests/lifecycle/async_commit.sh
    step "16/19 lifecycle paths: a watched resource stays fenced after pg_dump/restore, promotion, PITR and pg_upgrade (tests/lifecycle)"
    tests/lifecycle/watch_carried.sh
    step "16/19 lifecycle paths: a watch registered under 0.1.0 survives ALTER EXTENSION UPDATE and the loss of its state file (tests/lifecycle)"
    tests/lifecycle/watch_upgrade.sh
    step "16/19 lifecycle paths: PostgreSQL lease tokens never go back after a crash, a promotion, PITR, pg_dump/restore and pg_upgrade (tests/lifecycle/leases_carried.sh)"
    tests/lifecycle/leases_carried.sh
    step "16/19 lifecycle paths: a lease token granted in a history a copy lost, also the database's first grant, is refused (FT003) after a promotion, PITR, pg_rewind and pg_dump/restore (tests/lifecycle/lost_history.sh)"
    tests/lifecycle/lost_history.sh
    step "16/19 lifecycle paths: the set-based shape refuses every write (FT004) where the library is no longer preloaded, fencing_protect gives the row-trigger shape there, a dump keeps the shape and its fence (tests/lifecycle/preload_removed.sh)"
    tests/lifecycle/preload_removed.sh
    for shape in set-based row-trigger; do
        step "16/19 lifecycle paths: logical replication keeps the subscriber's marks and tombstones up, $shape shape (tests/lifecycle/logical.sh, PGF_SHAPE=$shape)"
        PGF_SHAPE=$shape tests/lifecycle/logical.sh
        step "16/19 lifecycle paths: backup and restore, every documented procedure, $shape shape (tests/lifecycle/restore.sh, PGF_SHAPE=$shape)"
        PGF_SHAPE=$shape tests/lifecycle/restore.sh
    done
}

stage_partition() {
    step "17/19 network partitions between PostgreSQL and a three-member etcd cluster, 150 s, independent checker (tests/partition)"
    tests/partition/run.sh --seconds 150 --seed 14
    step "17/19 negative control: the same without fencing must show violations (tests/partition --unfenced)"
    tests/partition/run.sh --seconds 60 --seed 3 --unfenced
}

stage_pg18_suites() {
    # Stage 4's builds, if it started them in the background: their result, then the tarball
    # installed and tested.
    if [ -n "$PG18_BUILD_PID" ]; then
        pg18_build_wait
        pg18_installed
    fi
    # Stages 6 to 13 and 16 again, against PostgreSQL 18 (the build stage 4 installed there).
    export PGF_PG_MAJOR=18
    step "18/19 on PostgreSQL 18: randomized stress test, 16 clients, tombstones pruned (tests/stress)"
    tests/stress/run.sh --clients 16 --writes 10000 --seconds 300 --seed 1 --prune
    step "18/19 on PostgreSQL 18: crash under the stress load (tests/stress --crash)"
    tests/stress/run.sh --clients 16 --writes 8000 --seconds 300 --seed 2 --crash
    step "18/19 on PostgreSQL 18: stress and crash in the row-trigger shape (tests/stress --shape row-trigger)"
    tests/stress/run.sh --clients 16 --writes 5000 --seconds 300 --seed 4 --prune --shape row-trigger
    tests/stress/run.sh --clients 16 --writes 4000 --seconds 300 --seed 5 --crash --shape row-trigger
    step "18/19 on PostgreSQL 18: negative control (tests/stress --unfenced)"
    stress_unfenced
    for shape in set-based row-trigger; do
        step "18/19 on PostgreSQL 18: streaming standby and promotion, $shape shape (tests/replication, PGF_SHAPE=$shape)"
        PGF_SHAPE=$shape tests/replication/standby.sh
    done
    step "18/19 on PostgreSQL 18: background worker with real etcd (tests/worker --worker-only)"
    # The worker's scenarios against 18's server; etcd over TLS, with authentication and behind
    # grpc-proxy, and the many-locks run test the worker's etcd client, the same code on every
    # major: stage 10 runs them.
    tests/worker/run.sh --worker-only
    step "18/19 on PostgreSQL 18: pooler safety (tests/pooler)"
    tests/pooler/run.sh
    step "18/19 on PostgreSQL 18: upgrade from every released version (tests/upgrade)"
    tests/upgrade/run.sh
    step "18/19 on PostgreSQL 18: observability (tests/observability)"
    tests/observability/run.sh
    step "18/19 on PostgreSQL 18: the bypass hunter, with the temporal-key state (tests/bypass)"
    # (seed 2 wrote no FT001 once the preloading axis changed every sequence: the hunter fails a
    # run that misses an outcome; seed 5 reaches all of them, 42P10 of the temporal key included)
    tests/bypass/run.sh --seed 5 --sequences 20 --steps 40
    step "18/19 on PostgreSQL 18: a Citus cluster, Citus built from its source (tests/citus)"
    tests/citus/run.sh
    step "18/19 on PostgreSQL 18: a Citus worker cut off by the network and back (tests/citus/partition.sh)"
    tests/citus/partition.sh
    step "18/19 on PostgreSQL 18: the Python, Node and Rust packages, where pg_stat_statements normalises SET LOCAL (tests/pyclient, tests/nodeclient, tests/rustclient)"
    tests/pyclient/run.sh
    tests/nodeclient/run.sh
    tests/rustclient/run.sh
    step "18/19 on PostgreSQL 18: PostgreSQL leases under concurrency (tests/leases)"
    tests/leases/run.sh
    step "18/19 on PostgreSQL 18: lifecycle paths (tests/lifecycle: asynchronous commit, watch carried, watch from 0.1.0, lease tokens carried, a lost first grant, the set-based shape without preloading)"
    for t in async_commit watch_carried watch_upgrade leases_carried lost_history preload_removed; do tests/lifecycle/$t.sh; done
    for shape in set-based row-trigger; do
        step "18/19 on PostgreSQL 18: lifecycle paths in the $shape shape: logical replication, backup and restore (tests/lifecycle/{logical,restore}.sh, PGF_SHAPE=$shape)"
        for t in logical restore; do PGF_SHAPE=$shape tests/lifecycle/$t.sh; done
    done
    unset PGF_PG_MAJOR
    for shape in set-based row-trigger; do
        step "18/19 from 15 to 18: marks, tombstones and a watch carried across majors, $shape shape (tests/lifecycle/major_upgrade.sh, PGF_SHAPE=$shape)"
        PGF_SHAPE=$shape tests/lifecycle/major_upgrade.sh
    done
}

stage_remove() {
    step "19/19 the Debian package removed with apt-get remove: none of its files is left"
    apt_run apt-get remove -y -qq -o DPkg::Lock::Timeout=300 "$DEB_NAME" >"$WORK/apt-remove.log" 2>&1 \
        || { cat "$WORK/apt-remove.log"; exit 1; }
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$DEB_NAME" 2>/dev/null || true)
    case "$status" in ""|un*) ;; *) echo "FAIL: after apt-get remove, dpkg says $DEB_NAME is '$status'" >&2; exit 1 ;; esac  # not run: text
    left=0
    while read -r f; do
        if [ -f "$f" ] || [ -L "$f" ]; then echo "  FAIL: left behind: $f"; left=1; fi
        # A directory the package made for itself must be gone too (/usr/share/doc/<package>).
        case "$f" in "/usr/share/doc/$DEB_NAME"*) [ -e "$f" ] && { echo "  FAIL: left behind: $f"; left=1; } ;; esac
    done <"$WORK/deb-files.txt"
    [ $left -eq 0 ] || exit 1
    echo "  removed: none of the $(grep -c . "$WORK/deb-files.txt") paths dpkg -L listed is left (dpkg status: ${status:-none})"
    # Leave a working pg_fencing in place: the release build, each file unlinked and written anew.
    $SUDO cp -r --remove-destination target/release/pg_fencing-pg15/usr/. /usr/
    echo "  the release build is back in place (copied, as the install stage does)"
}

for s in $STAGES; do
    declare -F "stage_$s" >/dev/null || { echo "unknown stage $s (--list shows them)" >&2; exit 2; }
done
for s in $STAGES; do "stage_$s"; done
source scripts/system-install.sh
if [ -f "$REPLACED_DIR/LAST" ] && [ "$REPLACED_DIR/LAST" -nt target/.test-started ]; then
    read -r replaced_dir replaced_owner <"$REPLACED_DIR/LAST"
    replaced_install_say "$replaced_dir" "${replaced_owner:-}" "(see above)" "the system PostgreSQL 15"
fi
if [ "$STAGES" = "$ALL_STAGES" ]; then
    step "all tests passed"
else
    step "passed: $(echo $STAGES)"
fi
