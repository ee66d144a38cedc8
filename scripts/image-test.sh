#!/usr/bin/env bash
# The OCI image for CloudNativePG, as CloudNativePG uses it (PostgreSQL 18):
#   scripts/image-test.sh
# builds the image from the tests' PostgreSQL 18 installation (packaging/oci-image.sh --from-installation),
# unpacks its one layer the way an image volume presents it (read-only, at a directory of its own), and
# starts a PostgreSQL 18 whose installation has no rate_limit file, with extension_control_path and
# dynamic_library_path naming the image's share/ and lib/ (what CloudNativePG appends) and the library
# preloaded from there; then creates the extension, checks that every C function names the library
# without $libdir, and runs the seed example in both stores.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=cluster.sh
source scripts/cluster.sh
TEST_ROOT=${RATE_LIMIT_TEST_DIR:-/var/tmp/rate_limit-test}
v=18
port=$((6150 + v))
work="$TEST_ROOT/image"
copy="$TEST_ROOT/image-pg/$v"
dir="$TEST_ROOT/image-$v"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)

PG_CACHE="$TEST_ROOT/image-pg" cluster_stop "$v" "$dir"
rm -rf "$work" "$copy" "$dir"
packaging/oci-image.sh --from-installation "$PG_CACHE/$v" "$work"

# the image volume: the layer's files, read-only, where CloudNativePG would mount them
volume="$work/extensions/rate_limit"
mkdir -p "$work/unpacked"
umoci unpack --rootless --image "$work/oci:$version-pg$v" "$work/unpacked/bundle" >/dev/null
mkdir -p "$(dirname "$volume")"
mv "$work/unpacked/bundle/rootfs" "$volume"
find "$volume" -type f | sed "s|^$volume/||" | sort >"$work/files"
grep -qx 'lib/rate_limit.so' "$work/files"
grep -qx 'share/extension/rate_limit.control' "$work/files"
grep -qx "share/extension/rate_limit--$version.sql" "$work/files"
if grep -v -e '^lib/rate_limit.so$' -e '^share/extension/rate_limit' "$work/files"; then
  echo "the image holds more than the extension" >&2; exit 1
fi
chmod -R a-w "$volume"
[ "$(id -u)" != 0 ] || chown -R postgres "$work/extensions"

# a PostgreSQL 18 without rate_limit's files (hard links), pointed at the image's directories
mkdir -p "$(dirname "$copy")"
cp -al "$PG_CACHE/$v" "$copy"
rm -f "$("$copy/bin/pg_config" --pkglibdir)"/rate_limit*.so "$("$copy/bin/pg_config" --sharedir)"/extension/rate_limit*
PG_CACHE="$TEST_ROOT/image-pg" cluster_start "$v" "$dir" "$port" "fsync = off" \
  "extension_control_path = '\$system:$volume/share'" "dynamic_library_path = '\$libdir:$volume/lib'" \
  "shared_preload_libraries = 'rate_limit'"
stop() { PG_CACHE="$TEST_ROOT/image-pg" cluster_stop "$v" "$dir"; }
trap stop EXIT
psql_i() { PG_CACHE="$TEST_ROOT/image-pg" psql_at "$v" "$port" "$@"; }

psql_i -d postgres -qc "DROP DATABASE IF EXISTS image" -c "CREATE DATABASE image"
psql_i -d image -qc "CREATE EXTENSION rate_limit"
[ "$(psql_i -d image -qAtc "SELECT extversion FROM pg_extension WHERE extname = 'rate_limit'")" = "$version" ]
# every C function names the library as dynamic_library_path finds it
[ "$(psql_i -d image -qAtc "SELECT count(*) FROM pg_proc WHERE prolang = 13 AND probin LIKE '%libdir%'
                           AND pronamespace = 'rate_limit'::regnamespace")" = 0 ]
for store in table memory; do
  got=$(psql_i -d image -qAtc "SET rate_limit.store = '$store';
        SELECT string_agg(rate_limiting_request('seed_$store', 1, 10)::text, ' ' ORDER BY n)
        FROM generate_series(1, 12) AS n")
  if [ "$got" != "9 8 7 6 5 4 3 2 1 0 -1 -1" ]; then echo "$store store: $got" >&2; exit 1; fi
done
echo "the image's extension, preloaded from $volume/lib: the seed example prints 9 8 7 6 5 4 3 2 1 0 -1 -1 in both stores"
