#!/usr/bin/env bash
# Builds the installable artefacts, per PostgreSQL version (default: 13 to 18):
#   scripts/package.sh [versions]
# into target/package/:
#   pgNN/                                   the `cargo pgrx package` tree (release build, paths of the
#                                           tests' PostgreSQL build it was made with)
#   postgresql-NN-rate-limit_V-1_ARCH.deb   a Debian package for the postgresql-NN server packages:
#                                           /usr/lib/postgresql/NN/lib/rate_limit.so and the control file,
#                                           install and upgrade scripts in /usr/share/postgresql/NN/extension;
#                                           no Rust needed where it is installed.
# The library is built against the headers of the tests' own build of each major version, which has the
# same extension ABI as the distribution's packages of that major version (PostgreSQL's module magic block
# checks it when the library loads).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(13 14 15 16 17 18)
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=cluster.sh
source scripts/cluster.sh

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
out="$ROOT/target/package"
mkdir -p "$out"
for v in "${VERSIONS[@]}"; do
  pg_config="$(pg_bindir "$v")/pg_config"
  tree="$out/pg$v"
  rm -rf "$tree"
  cargo pgrx package --pg-config "$pg_config" --features "pg$v" --no-default-features --out-dir "$tree" >"$out/pg$v.log" 2>&1 ||
    { tail -30 "$out/pg$v.log"; exit 1; }
  pkglibdir=$("$pg_config" --pkglibdir)
  sharedir=$("$pg_config" --sharedir)

  name="postgresql-$v-rate-limit"
  stage="$out/$name"
  rm -rf "$stage"
  mkdir -p "$stage/DEBIAN" "$stage/usr/lib/postgresql/$v/lib" "$stage/usr/share/postgresql/$v/extension" \
    "$stage/usr/share/doc/$name"
  install -m 644 "$tree$pkglibdir/rate_limit.so" "$stage/usr/lib/postgresql/$v/lib/"
  install -m 644 "$tree$sharedir/extension/"rate_limit* "$stage/usr/share/postgresql/$v/extension/"
  install -m 644 README.md "$stage/usr/share/doc/$name/README.md"
  cat >"$stage/usr/share/doc/$name/copyright" <<COPYRIGHT
rate_limit: exact token-bucket rate limiting inside PostgreSQL.
License: PostgreSQL (see Cargo.toml). Built from the rate_limit repository, version $version.
COPYRIGHT
  installed_kb=$(du -sk "$stage/usr" | cut -f1)
  cat >"$stage/DEBIAN/control" <<CONTROL
Package: $name
Version: $version-1
Architecture: $arch
Maintainer: rate_limit developers <rate-limit@localhost>
Installed-Size: $installed_kb
Depends: postgresql-$v, libc6 (>= 2.34), libgcc-s1
Section: database
Priority: optional
Description: exact token-bucket rate limiting inside PostgreSQL $v
 The rate_limit extension: rate_limiting_request(), named policies with token
 bucket, fixed window and sliding window algorithms, a table store and a
 shared-memory store, statistics, a background purge worker and a trigger
 helper for limiting writes. CREATE EXTENSION rate_limit; add rate_limit to
 shared_preload_libraries for the memory store, statistics and the worker.
CONTROL
  deb="$out/${name}_$version-1_$arch.deb"
  dpkg-deb --build --root-owner-group "$stage" "$deb" >/dev/null
  echo "built $deb and $tree"
done
