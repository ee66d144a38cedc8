#!/usr/bin/env bash
# ALTER EXTENSION rate_limit UPDATE from every released version (sql/RELEASED) to the current one, on one
# PostgreSQL version:
#   scripts/upgrade-test.sh 15
# For each released version: build and install that commit's library and script (from git history), create
# the extension at that version in a database of its own and write policies and buckets with it
# (tests/upgrade/data-VERSION.sql). Then install the current library, update every database, and check:
#   - the same objects, privileges and comments as a fresh install (tests/upgrade/catalog.sql, diffed);
#   - every policy and bucket kept (tests/upgrade/check-data.sql);
#   - the same behaviour: the pg_regress examples pass in the updated database.
# It installs libraries into the tests' PostgreSQL installation: no server of that version may be running
# (scripts/test.sh runs it before starting its clusters). Its own server listens on port 6000 + VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
v=${1:?usage: scripts/upgrade-test.sh PGVERSION}
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=cluster.sh
source scripts/cluster.sh
TEST_ROOT=${RATE_LIMIT_TEST_DIR:-/var/tmp/rate_limit-test}
dir="$TEST_ROOT/upgrade-$v"
out="$TEST_ROOT/upgrade-$v-out"
port=$((6000 + v))
pg_config="$(pg_bindir "$v")/pg_config"
mkdir -p "$TEST_ROOT/old-sources" "$out"
[ "$(id -u)" != 0 ] || chown postgres "$out"

install_library() { # install_library SOURCE_DIR TARGET_DIR: builds and installs that tree's library and SQL
  (cd "$1" && CARGO_TARGET_DIR="$2" cargo pgrx install --pg-config "$pg_config" \
    --features "pg$v" --no-default-features >"$out/install.log" 2>&1) ||
    { tail -30 "$out/install.log"; return 1; }
}

sql() { psql_at "$v" "$port" -q "$@"; }

cluster_stop "$v" "$dir"
trap 'cluster_stop "$v" "$dir"' EXIT # an interrupted run stops its server
rm -rf "$dir"
current=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
# every released version but the current one (which a fresh install is) whose library builds on this
# PostgreSQL version (sql/RELEASED's third column): only those can be installed here to be updated
mapfile -t released < <(grep -v '^#' sql/RELEASED |
  awk -v cur="$current" -v pg="$v" 'NF && $1 != cur && ("," $3 ",") ~ ("," pg ",") { print $1 " " $2 }')
for line in "${released[@]}"; do
  read -r version commit <<<"$line"
  src="$TEST_ROOT/old-sources/$version"
  if [ ! -f "$src/.commit" ] || [ "$(cat "$src/.commit")" != "$commit" ]; then
    rm -rf "$src" && mkdir -p "$src"
    # extracted files carry the commit's time: give them the present one, so cargo never takes them for
    # the sources of an earlier build
    git archive "$commit" | tar -x -m -C "$src"
    echo "$commit" >"$src/.commit"
  fi
  # releases before 0.4.0 name no feature for PostgreSQL 14 and 16; they were built with the same pgrx,
  # which supports both: give the tree the feature this version builds with
  grep -q "^pg$v = " "$src/Cargo.toml" ||
    sed -i "/^\[features\]/a pg$v = [\"pgrx/pg$v\", \"pgrx-tests/pg$v\"]" "$src/Cargo.toml"
  echo "installing released $version ($commit)"
  cluster_stop "$v" "$dir"
  install_library "$src" "$TEST_ROOT/old-target-$version"
  cluster_start "$v" "$dir" "$port" "fsync = off" "shared_preload_libraries = 'rate_limit'" \
    "rate_limit.purge_interval = 0"
  db="from_${version//./_}"
  sql -d postgres -c "CREATE DATABASE $db"
  sql -d "$db" -c "CREATE EXTENSION rate_limit VERSION '$version'"
  sql -d "$db" -f "tests/upgrade/data-$version.sql" >/dev/null
done

echo "installing the current version"
cluster_stop "$v" "$dir"
install_library "$ROOT" "${CARGO_TARGET_DIR:-$ROOT/target}"
cluster_start "$v" "$dir" "$port"
sql -d postgres -c "CREATE DATABASE fresh"
sql -d fresh -c "CREATE EXTENSION rate_limit"
sql -d fresh -Atf tests/upgrade/catalog.sql >"$out/fresh.catalog"
status=0
for line in "${released[@]}"; do
  read -r version _ <<<"$line"
  db="from_${version//./_}"
  sql -d "$db" -c "ALTER EXTENSION rate_limit UPDATE"
  sql -d "$db" -Atf tests/upgrade/catalog.sql >"$out/$db.catalog"
  if ! diff -u "$out/fresh.catalog" "$out/$db.catalog"; then
    echo "FAILED: the extension updated from $version differs from a fresh install (above)"; status=1
  fi
  sql -d "$db" -f tests/upgrade/check-data.sql || { echo "FAILED: data not kept from $version"; status=1; }
  # the same behaviour: the examples (all but setup, which creates the extension) in the updated database,
  # once the upgrade's own policies and buckets are gone
  sql -d "$db" -f tests/upgrade/clear.sql
  run_regress "$v" "$port" "$db" "$out/regress-$db" "${REGRESS_TESTS[@]:1}" ||
    { echo "FAILED: the pg_regress examples in the database updated from $version"; status=1; }
done
cluster_stop "$v" "$dir"
if [ ${#released[@]} = 0 ]; then
  echo "no released version builds on PostgreSQL $v (sql/RELEASED): only a fresh install exists here"
fi
[ "$status" = 0 ] && echo "updated from every released version that builds on PostgreSQL $v: ${released[*]}"
exit "$status"
