# Sourced by scripts/setup.sh and scripts/lib.sh: package managers (apt-get, dpkg, cargo install,
# rustup, pip, npm) run with a clean environment, whatever the caller exported. Their maintainer
# scripts and build steps start other programs (Debian's py3compile starts Python; node-gyp,
# build.rs and pip's build backends too), so a variable such as PYTHONHOME=/nonexistent in the
# caller's shell broke `apt-get install pgxnclient` on a fresh machine (issue 42). What survives is
# what reaches a registry and where the tools are: the same list as scripts/hermetic.sh, and
# pip's and npm's own settings (PIP_*, npm_config_*). scripts/check-scripts.sh checks that every
# package manager call of setup.sh, test.sh and package.sh goes through these functions.

PKG_ENV_KEEP='^(PATH|HOME|USER|LOGNAME|TERM|CI|CARGO_HOME|RUSTUP_HOME|PGRX_HOME'
PKG_ENV_KEEP+='|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY|all_proxy|ALL_PROXY|SSL_CERT_FILE|SSL_CERT_DIR'
PKG_ENV_KEEP+='|CURL_CA_BUNDLE|REQUESTS_CA_BUNDLE|NODE_EXTRA_CA_CERTS|CARGO_HTTP_[A-Z_]+|CARGO_NET_[A-Z_]+'
PKG_ENV_KEEP+='|CARGO_REGISTRIES_[A-Z0-9_]+|RUSTUP_[A-Z_]+|PIP_[A-Z_]+|npm_config_[a-z_]+|NPM_CONFIG_[A-Z_]+)$'
# apt and dpkg run their maintainer scripts with the system's directories only (not a bare
# python3 or a project's tools that a test put first on PATH).
PKG_SYSTEM_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# pkg_run CMD...: CMD with only the variables of PKG_ENV_KEEP (LANG=C.UTF-8).
pkg_env() {  # prints nothing; fills the array PKG_ENV with what survives
    local v
    PKG_ENV=(LANG=C.UTF-8)
    for v in $(compgen -e); do
        [[ $v =~ $PKG_ENV_KEEP ]] && PKG_ENV+=("$v=${!v}")
    done
    return 0
}
pkg_run() {
    pkg_env
    env -i "${PKG_ENV[@]}" "$@"
}

# apt_run apt-get|dpkg ARGS...: as pkg_run, as root (sudo if need be), non-interactive, with the
# system's PATH.
apt_run() {
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    pkg_env
    "${sudo[@]}" env -i "${PKG_ENV[@]}" PATH="$PKG_SYSTEM_PATH" DEBIAN_FRONTEND=noninteractive "$@"
}
