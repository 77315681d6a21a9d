#!/usr/bin/env bash
# Installs what pg_fencing needs on a fresh Debian 12 machine, skipping what is already there,
# then builds and installs the extension into the system PostgreSQL 15.
#   apt: postgresql-15 postgresql-server-dev-15 libclang-dev protobuf-compiler sudo etcd-server etcd-client
#        build-essential pkg-config python3-psycopg2 (for the stress checker) pgbouncer (pooler test)
#   (a Rust toolchain with cargo must already be there, as on every machine of this kind: rustup)
#   cargo: cargo-pgrx 0.18.1 (matches pgrx = "=0.18.1" in Cargo.toml), `cargo pgrx init --pg15`;
#          cargo-fuzz (the fuzz targets in fuzz/; they build with the nightly toolchain that
#          rustup installs on machines of this kind)
# Needs root (or passwordless sudo) for apt and for installing into /usr/lib/postgresql.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found. pg_fencing needs a Rust toolchain (1.95 is what this project is" >&2
    echo "built with; install it with rustup: https://rustup.rs), then run this again." >&2
    exit 1
fi

pkgs=(postgresql-15 postgresql-server-dev-15 libclang-dev protobuf-compiler sudo etcd-server etcd-client
      build-essential pkg-config python3-psycopg2 pgbouncer)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The Debian package starts a cluster on port 5432; we never use it, but leave it alone.

if ! cargo pgrx --version 2>/dev/null | grep -q "0.18.1"; then
    log "cargo install cargo-pgrx 0.18.1 (takes about 6 minutes)"
    cargo install cargo-pgrx --version 0.18.1 --locked
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "cargo install cargo-fuzz (about 2 minutes)"
    cargo install cargo-fuzz --locked
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    log "rustup toolchain install nightly (for the fuzz targets)"
    rustup toolchain install nightly --profile minimal
fi
if ! grep -qs "pg15 = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    log "cargo pgrx init --pg15 $PG_CONFIG"
    cargo pgrx init --pg15 "$PG_CONFIG"
fi

log "building and installing pg_fencing into $($PG_CONFIG --pkglibdir)"
if [ -n "$SUDO" ]; then
    cargo pgrx install --pg-config "$PG_CONFIG" --sudo
else
    cargo pgrx install --pg-config "$PG_CONFIG"
fi
