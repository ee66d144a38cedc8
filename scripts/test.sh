#!/usr/bin/env bash
# Runs every test layer on PostgreSQL 13, 15, 17 and 18, installing whatever is missing first.
#
#   scripts/test.sh            all four versions
#   scripts/test.sh 15 17      only these
#
# Layers, per version (every server is one of the tests' own PostgreSQL installations in
# $RATE_LIMIT_PG_CACHE, never the system's; running servers elsewhere are not touched):
#   1. unit + property tests of the arithmetic and #[pg_test]s   (cargo pgrx test pgNN)
#   2. pg_regress examples in tests/pg_regress                     (against a fresh preloaded cluster)
#   3. integration tests in tests/integration: many connections    (that cluster, a streaming standby of it,
#                                                                     a 256-bucket one, an unpreloaded one and
#                                                                     one whose clock libfaketime steps)
#   4. client tests in tests/clients: node-postgres, which sends every parameter untyped
# Lints (cargo fmt --check, cargo clippy -D warnings) run once first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(13 15 17 18)
for v in "${VERSIONS[@]}"; do
  case $v in 13|15|17|18) ;; *) echo "unsupported PostgreSQL version: $v (use 13, 15, 17 or 18)" >&2; exit 2 ;; esac
done

if [ "${VERSIONS[*]}" = 15 ]; then scripts/install-deps.sh; else scripts/install-deps.sh --all; fi
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=cluster.sh
source scripts/cluster.sh

TEST_ROOT=${RATE_LIMIT_TEST_DIR:-/var/tmp/rate_limit-test}
mkdir -p "$TEST_ROOT"
[ "$(id -u)" != 0 ] || chown postgres "$TEST_ROOT"
RUNAS=()
[ "$(id -u)" != 0 ] || RUNAS=(--runas postgres)

passed=0
failed=0
step() { # step NAME COMMAND...: runs a layer, counts it, keeps going so every failure is reported
  local name=$1
  shift
  echo
  echo "=== $name"
  if "$@"; then
    passed=$((passed + 1)); echo "--- ok: $name"
  else
    failed=$((failed + 1)); echo "--- FAILED: $name"
  fi
}

lint() {
  cargo fmt --all --check &&
    cargo clippy --all-targets -- -D warnings &&
    cargo clippy -p rate_limit_integration --all-targets -- -D warnings
}

regress() { # regress VERSION PORT
  local v=$1 port=$2 pgxs out
  pgxs=$("$(pg_bindir "$v")/pg_config" --pgxs)
  out="$TEST_ROOT/regress-$v"
  rm -rf "$out" && mkdir -p "$out"
  psql_at "$v" "$port" -d postgres -qc "DROP DATABASE IF EXISTS rate_limit_regress" -c "CREATE DATABASE rate_limit_regress"
  # the same settings as `cargo pgrx regress`: no NOTICEs in the expected files
  PGOPTIONS="-c client_min_messages=warning" "$(dirname "$(dirname "$pgxs")")/test/regress/pg_regress" \
    --use-existing --dbname=rate_limit_regress --host="$RATE_LIMIT_SOCKET_DIR" --port="$port" \
    --user=postgres --inputdir="$ROOT/tests/pg_regress" --outputdir="$out" \
    --bindir="$(pg_bindir "$v")" \
    setup seed_timeline management transactions errors permissions memory_store policies policy_errors postgrest ||
    { cat "$out/regression.diffs" 2>/dev/null; return 1; }
}

integration() { # integration VERSION: main (preloaded), small (256 buckets), standby, plain (not preloaded)
  local v=$1
  RATE_LIMIT_TEST_CONNINFO="$(conninfo $((5500 + v)))" \
  RATE_LIMIT_TEST_STANDBY_CONNINFO="$(conninfo $((5600 + v)))" \
  RATE_LIMIT_TEST_SMALL_CONNINFO="$(conninfo $((5700 + v)))" \
  RATE_LIMIT_TEST_SMALL_RESTART="$(restart_command "$v" "$TEST_ROOT/small-$v")" \
  RATE_LIMIT_TEST_PLAIN_CONNINFO="$(conninfo $((5800 + v)))" \
  RATE_LIMIT_TEST_FAKETIME_CONNINFO="$(conninfo $((5900 + v)))" \
  RATE_LIMIT_TEST_FAKETIME_FILE="$(faketime_file "$v")" \
  RATE_LIMIT_TEST_BINDIR="$(pg_bindir "$v")" \
    cargo test -p rate_limit_integration -- --test-threads=1
}

clients() { # clients VERSION: the node-postgres client test against the main cluster
  RATE_LIMIT_TEST_CONNINFO="$(conninfo $((5500 + $1)))" node --test tests/clients/
}

faketime_file() { echo "$TEST_ROOT/faketime-$1.rc"; }

faketime_cluster_start() { # a preloaded cluster whose wall clock follows $(faketime_file VERSION)
  local v=$1 dir="$TEST_ROOT/faketime-$1" lib
  lib=$(dpkg -L libfaketime | grep '/libfaketime.so.1$')
  echo "+0" >"$(faketime_file "$v")"
  chmod 644 "$(faketime_file "$v")"
  cluster_start "$v" "$dir" $((5900 + v)) "fsync = off" "shared_preload_libraries = 'rate_limit'"
  cluster_stop "$v" "$dir"
  # monotonic clocks are left alone, as an NTP step or a VM restore leaves them
  as_pg "LD_PRELOAD='$lib' FAKETIME_TIMESTAMP_FILE='$(faketime_file "$v")' FAKETIME_NO_CACHE=1 \
    FAKETIME_DONT_FAKE_MONOTONIC=1 '$(pg_bindir "$v")/pg_ctl' -D '$dir' -l '$dir/server.log' -w -t 60 start" >/dev/null
}

conninfo() { echo "host=$RATE_LIMIT_SOCKET_DIR port=$1 user=postgres"; }

restart_command() { # the shell command that restarts a cluster, for the restart test
  local pg_ctl
  pg_ctl="'$(pg_bindir "$1")/pg_ctl' -D '$2' -l '$2/server.log' -w -t 60 -m fast restart"
  if [ "$(id -u)" = 0 ]; then echo "su postgres -s /bin/bash -c \"$pg_ctl\" >/dev/null"; else echo "$pg_ctl >/dev/null"; fi
}

start_clusters() { # start_clusters VERSION: the four servers the regress and integration tests use
  local v=$1 preload="shared_preload_libraries = 'rate_limit'"
  stop_clusters "$v"
  rm -rf "$TEST_ROOT/cluster-$v" "$TEST_ROOT/standby-$v" "$TEST_ROOT/small-$v" "$TEST_ROOT/plain-$v" \
    "$TEST_ROOT/faketime-$v"
  cluster_start "$v" "$TEST_ROOT/cluster-$v" $((5500 + v)) "fsync = off" "$preload" \
    "rate_limit.max_buckets = 300000"
  as_pg "'$(pg_bindir "$v")/pg_basebackup' -h '$RATE_LIMIT_SOCKET_DIR' -p $((5500 + v)) -U postgres \
    -D '$TEST_ROOT/standby-$v' -R -X stream"
  echo "port = $((5600 + v))" | as_pg "cat >> '$TEST_ROOT/standby-$v/postgresql.conf'"
  cluster_start "$v" "$TEST_ROOT/standby-$v" $((5600 + v))
  cluster_start "$v" "$TEST_ROOT/small-$v" $((5700 + v)) "fsync = off" "$preload" "rate_limit.max_buckets = 256"
  cluster_start "$v" "$TEST_ROOT/plain-$v" $((5800 + v)) "fsync = off"
  faketime_cluster_start "$v"
}

stop_clusters() {
  local v=$1 c
  for c in standby cluster small plain faketime; do cluster_stop "$v" "$TEST_ROOT/$c-$v"; done
}

step "lint" lint
for v in "${VERSIONS[@]}"; do
  # the test install replaces the library in place: stop this version's test servers first (a server that
  # has the file mapped would crash); servers that are not the tests' own are never touched
  stop_clusters "$v"
  step "PostgreSQL $v: unit, property and #[pg_test] tests" \
    cargo pgrx test "pg$v" "${RUNAS[@]}" --pgdata "$TEST_ROOT/pgrx-$v"
  step "PostgreSQL $v: install" \
    cargo pgrx install --pg-config "$(pg_bindir "$v")/pg_config" --features "pg$v" --no-default-features
  start_clusters "$v"
  step "PostgreSQL $v: pg_regress examples" regress "$v" $((5500 + v))
  step "PostgreSQL $v: integration tests" integration "$v"
  step "PostgreSQL $v: untyped parameters from node-postgres" clients "$v"
  stop_clusters "$v"
done

echo
echo "summary: $passed passed, $failed failed"
[ "$failed" = 0 ]
