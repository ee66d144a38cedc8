#!/usr/bin/env bash
# Runs every test layer on PostgreSQL 13, 15, 17 and 18, installing whatever is missing first.
#
#   scripts/test.sh            all four versions
#   scripts/test.sh 15 17      only these
#
# Layers, per version:
#   1. unit + property tests of the arithmetic and #[pg_test]s   (cargo pgrx test pgNN)
#   2. pg_regress examples in tests/pg_regress                     (against a fresh cluster)
#   3. integration tests in tests/integration: many connections    (against the same cluster)
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
    setup seed_timeline management transactions errors permissions ||
    { cat "$out/regression.diffs" 2>/dev/null; return 1; }
}

integration() { # integration PORT
  RATE_LIMIT_TEST_CONNINFO="host=$RATE_LIMIT_SOCKET_DIR port=$1 user=postgres" \
    cargo test -p rate_limit_integration -- --test-threads=1
}

step "lint" lint
for v in "${VERSIONS[@]}"; do
  step "PostgreSQL $v: unit, property and #[pg_test] tests" \
    cargo pgrx test "pg$v" "${RUNAS[@]}" --pgdata "$TEST_ROOT/pgrx-$v"
  step "PostgreSQL $v: install" \
    cargo pgrx install --pg-config "$(pg_bindir "$v")/pg_config" --features "pg$v" --no-default-features
  dir="$TEST_ROOT/cluster-$v"
  port=$((5500 + v))
  cluster_stop "$v" "$dir"
  rm -rf "$dir"
  cluster_start "$v" "$dir" "$port" "fsync = off"
  step "PostgreSQL $v: pg_regress examples" regress "$v" "$port"
  step "PostgreSQL $v: integration tests" integration "$port"
  cluster_stop "$v" "$dir"
done

echo
echo "summary: $passed passed, $failed failed"
[ "$failed" = 0 ]
