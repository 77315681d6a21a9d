# Sourced first thing by every entry script, before any other command:
#     source "$(dirname "$0")/<path to>/scripts/hermetic.sh" "$@"
# It starts the script again under `env -i` with only the variables named in HERMETIC_KEEP, so
# nothing of the caller's shell reaches it or what it starts: not libpq's PG*, etcdctl's
# ETCDCTL_*, Python's PYTHON*, cargo's build settings, and not the shell's own state either
# (exported functions, SHELLOPTS/BASHOPTS, BASH_ENV, CDPATH). docs/testing.md, "The environment".
# A script started by another entry script (PGF_HERMETIC set) is already hermetic; scripts/lib.sh
# then drops what its parent script exported for its own services.

# What survives: where the machine's tools are, how it reaches package registries (cargo may
# download crates during a build), CI, and the project's own documented knobs (ports, LEASE_TTL,
# KEEP_WORK, BENCH_*, PGF_PG_MAJOR, CITUS_SRC, CITUS_HUNT_*; docs/testing.md lists them).
HERMETIC_KEEP='^(PATH|HOME|USER|LOGNAME|SHELL|TERM|CI|CARGO_HOME|RUSTUP_HOME|PGRX_HOME'
HERMETIC_KEEP+='|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY|all_proxy|ALL_PROXY|SSL_CERT_FILE|SSL_CERT_DIR'
HERMETIC_KEEP+='|CURL_CA_BUNDLE|CARGO_HTTP_[A-Z_]+|CARGO_NET_[A-Z_]+|CARGO_REGISTRIES_[A-Z0-9_]+'
HERMETIC_KEEP+='|RUSTUP_DIST_SERVER|RUSTUP_UPDATE_ROOT'
HERMETIC_KEEP+='|PGF_PG_MAJOR|PGF_SHAPE|CITUS_SRC|CITUS_REBUILD|CITUS_HUNT_SEEDS|CITUS_HUNT_STEPS|PGPORT_[A-Z0-9_]+|ETCD_[A-Z_]+_PORT|ZK_[A-Z_]*PORT|REDIS_[A-Z_]*PORT|BOUNCER_PORT|LEASE_TTL|KEEP_WORK|BENCH_[A-Z_]+)$'

if [ -z "${PGF_HERMETIC:-}" ]; then
    _pgf_keep=()
    for _pgf_v in $(compgen -e); do
        [[ $_pgf_v =~ $HERMETIC_KEEP ]] && _pgf_keep+=("$_pgf_v=${!_pgf_v}")
    done
    exec env -i "${_pgf_keep[@]}" PGF_HERMETIC=1 LANG=C.UTF-8 bash "$0" "$@"
fi
