#!/usr/bin/env bash
# Runs every test layer on PostgreSQL 13, 14, 15, 16, 17 and 18, installing whatever is missing first.
#
#   scripts/test.sh            all six versions
#   scripts/test.sh 15 17      only these
#
# First, once: the lints, and the model's unit and property tests (cargo test -p rate_limit_model: the
# arithmetic of every limit and what a call decides, no PostgreSQL, seconds). Then layers, per version
# (every server is one of the tests' own PostgreSQL installations in $RATE_LIMIT_PG_CACHE, never the
# system's; running servers elsewhere are not touched):
#   1. unit tests of the extension's own modules and #[pg_test]s  (cargo pgrx test pgNN)
#   2. upgrades: ALTER EXTENSION UPDATE from every released version (scripts/upgrade-test.sh)
#   3. pg_regress examples in tests/pg_regress                     (against a fresh preloaded cluster)
#   4. integration tests in tests/integration: many connections    (that cluster, a streaming standby of it,
#                                                                     a 256-bucket one, an unpreloaded one and
#                                                                     one whose clock libfaketime steps)
#                                                                     and Debian's postgres_exporter and
#                                                                     Prometheus scraping it (monitoring.rs)
#   5. client tests in tests/clients: node-postgres, which sends every parameter untyped
#   6. (every version) the portable edition on a copy of the installation without rate_limit's files:
#      installed by psql -f, by pg_tle and by CREATE EXTENSION, each as a role without superuser; the
#      examples of its features and their integration tests (scripts/portable-test.sh)
#   7. (PostgreSQL 16, 17, 18: the versions Citus 14 supports) Citus: a coordinator and two workers, set up
#      by rate_limit.distribute() (tests/integration/tests/citus.rs; Citus 14.0.1 built by install-deps.sh)
#   8. (PostgreSQL 18) the OCI image for CloudNativePG, mounted as CloudNativePG mounts it, the library
#      preloaded from it through dynamic_library_path (scripts/image-test.sh)
#   9. (PostgreSQL 15) PL/Proxy: a router database set up by router/plproxy.sql, forwarding to two
#      partitions (tests/integration/tests/plproxy.rs; Debian's postgresql-15-plproxy, installed by
#      install-deps.sh); (PostgreSQL 13, 14, where every role may create in schema public) PL/Proxy again,
#      the router's search_path test only (PL/Proxy built from Debian's source package by install-deps.sh)
#  10. (PostgreSQL 15) failover: a standby promoted while clients hammer a key, with synchronous and
#      asynchronous replication and with its clock an hour off (tests/integration/tests/failover.rs)
#  11. (PostgreSQL 15) the examples of README.md and docs/: docs/examples/*.sql run on a preloaded cluster
#      with default settings must print exactly what the documents show (scripts/doc-examples.py)
# and, for PostgreSQL 15 as root, the .deb on a Debian system without Rust (scripts/package-test.sh).
# Layers 1 and 2 (and the install) need no server of another version, nor does the .deb: they run in the
# background one version ahead of the servers' layers (build_layers below), printed when reached.
# Lints (released upgrade scripts unchanged, the portable edition's file assembled from its sources, no
# import circle among src/'s modules at any depth, no file over 600 lines nor function over 80 outside
# tests, each of those two lints caught on a fixture (scripts/test-lints.sh), the Prometheus rules' own
# tests (promtool test rules), the dashboard is JSON, cargo fmt --check, cargo clippy -D warnings) run
# once first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(13 14 15 16 17 18)
for v in "${VERSIONS[@]}"; do
  case $v in 13|14|15|16|17|18) ;; *) echo "unsupported PostgreSQL version: $v (use 13 to 18)" >&2; exit 2 ;; esac
done

if [ "${VERSIONS[*]}" = 15 ]; then scripts/install-deps.sh; else scripts/install-deps.sh --all; fi
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=cluster.sh
source scripts/cluster.sh
# Every test server runs as a careless operator's might, with Rust backtraces on: none may reach a client
# (tests/integration/tests/misuse.rs checks both).
export RATE_LIMIT_SERVER_ENVIRONMENT="RUST_BACKTRACE=1"

TEST_ROOT=${RATE_LIMIT_TEST_DIR:-/var/tmp/rate_limit-test}
mkdir -p "$TEST_ROOT"
[ "$(id -u)" != 0 ] || chown postgres "$TEST_ROOT"
RUNAS=()
[ "$(id -u)" != 0 ] || RUNAS=(--runas postgres)

passed=0
failed=0
step() { # step NAME COMMAND...: runs a layer, counts it, keeps going so every failure is reported
  local name=$1 started=$SECONDS
  shift
  echo
  echo "=== $name"
  if "$@"; then
    passed=$((passed + 1)); echo "--- ok: $name ($((SECONDS - started)) s)"
  else
    failed=$((failed + 1)); echo "--- FAILED: $name ($((SECONDS - started)) s)"
  fi
}

lint() {
  scripts/check-upgrade-scripts.sh &&
    portable/assemble.sh --check &&
    scripts/test-lints.sh &&
    promtool check rules monitoring/rules.yml &&
    promtool test rules monitoring/rules.test.yml &&
    python3 -m json.tool monitoring/grafana-dashboard.json >/dev/null &&
    cargo fmt --all --check &&
    cargo clippy --all-targets -- -D warnings &&
    cargo clippy -p rate_limit_model --all-targets -- -D warnings &&
    cargo clippy -p rate_limit_integration --all-targets -- -D warnings &&
    cargo test -q -p rate_limit_integration --test surface # the SQL made from src/surface/ is in its files
}

regress() { # regress VERSION PORT: the examples in a new database of the main cluster
  local v=$1 port=$2
  psql_at "$v" "$port" -d postgres -qc "DROP DATABASE IF EXISTS rate_limit_regress" -c "CREATE DATABASE rate_limit_regress"
  run_regress "$v" "$port" rate_limit_regress "$TEST_ROOT/regress-$v" "${REGRESS_TESTS[@]}"
}

integration() { # integration VERSION: main (preloaded), small (256 buckets), standby, plain (not preloaded)
  local v=$1
  RATE_LIMIT_TEST_CONNINFO="$(conninfo $((5500 + v)))" \
  RATE_LIMIT_TEST_STANDBY_CONNINFO="$(conninfo $((5600 + v)))" \
  RATE_LIMIT_TEST_SMALL_CONNINFO="$(conninfo $((5700 + v)))" \
  RATE_LIMIT_TEST_SMALL_RESTART="$(pg_ctl_command "$v" "$TEST_ROOT/small-$v" restart)" \
  RATE_LIMIT_TEST_SMALL_STOP="$(pg_ctl_command "$v" "$TEST_ROOT/small-$v" stop)" \
  RATE_LIMIT_TEST_SMALL_START="$(pg_ctl_command "$v" "$TEST_ROOT/small-$v" start)" \
  RATE_LIMIT_TEST_SMALL_DATA="$TEST_ROOT/small-$v" \
  RATE_LIMIT_TEST_PLAIN_CONNINFO="$(conninfo $((5800 + v)))" \
  RATE_LIMIT_TEST_FAKETIME_CONNINFO="$(conninfo $((5900 + v)))" \
  RATE_LIMIT_TEST_FAKETIME_FILE="$(faketime_file "$v")" \
  RATE_LIMIT_TEST_FAKETIME_STOP="$(pg_ctl_command "$v" "$TEST_ROOT/faketime-$v" stop)" \
  RATE_LIMIT_TEST_FAKETIME_START="$(pg_ctl_command "$v" "$TEST_ROOT/faketime-$v" start "$(faketime_environment "$v")")" \
  RATE_LIMIT_TEST_BINDIR="$(pg_bindir "$v")" \
  RATE_LIMIT_TEST_CITUS_NODES=none RATE_LIMIT_TEST_PLPROXY=none RATE_LIMIT_TEST_FAILOVER=none \
    RATE_LIMIT_DIFFERENTIAL_CALLS=$([ "$v" = 15 ] && echo 100000 || echo 20000) \
    cargo test -p rate_limit_integration --no-fail-fast -- --test-threads=1
}

CITUS_NODES=(citus-coordinator citus-worker1 citus-worker2)
citus_port() { echo $((6200 + 100 * $2 + $1)); } # citus_port VERSION NODE_INDEX: 6217, 6317, 6417

citus() { # citus VERSION: three fresh nodes with Citus and rate_limit preloaded, then tests/citus.rs
  local v=$1 i nodes=() status=0
  for i in 0 1 2; do
    cluster_stop "$v" "$TEST_ROOT/${CITUS_NODES[i]}-$v"
    rm -rf "$TEST_ROOT/${CITUS_NODES[i]}-$v"
    # two-phase commit for transactions that write on both workers; no background purge unless a test
    # turns it on; the node reaches itself (a shard move does) on the socket, as it listens on no TCP port;
    # logical WAL for the shard moves that replicate logically
    cluster_start "$v" "$TEST_ROOT/${CITUS_NODES[i]}-$v" "$(citus_port "$v" "$i")" "fsync = off" \
      "shared_preload_libraries = 'citus,rate_limit'" "max_prepared_transactions = 100" \
      "rate_limit.purge_interval = 0" "citus.local_hostname = '$RATE_LIMIT_SOCKET_DIR'" \
      "wal_level = logical"
    nodes+=("$(conninfo "$(citus_port "$v" "$i")")")
  done
  RATE_LIMIT_TEST_CITUS_NODES="$(IFS=';'; echo "${nodes[*]}")" \
  RATE_LIMIT_TEST_CITUS_WORKER2_STOP="$(pg_ctl_command "$v" "$TEST_ROOT/${CITUS_NODES[2]}-$v" stop)" \
  RATE_LIMIT_TEST_CITUS_WORKER2_START="$(pg_ctl_command "$v" "$TEST_ROOT/${CITUS_NODES[2]}-$v" start)" \
    cargo test -p rate_limit_integration --test citus -- --test-threads=1 || status=$?
  for i in 0 1 2; do cluster_stop "$v" "$TEST_ROOT/${CITUS_NODES[i]}-$v"; done
  if [ "$status" != 0 ]; then # what the nodes said last (a failure under load may be the server's)
    for i in 0 1 2; do
      echo "--- ${CITUS_NODES[i]}-$v: the last errors in its server.log"
      grep -E -A2 '(ERROR|FATAL|PANIC|WARNING): ' "$TEST_ROOT/${CITUS_NODES[i]}-$v/server.log" | tail -n 30 || true
    done
  fi
  return "$status"
}

PLPROXY_SERVERS=(plproxy-router plproxy-partition0 plproxy-partition1)
plproxy_port() { echo $((6700 - 100 * $2 + $1)); } # plproxy_port VERSION SERVER_INDEX: 6715, 6615, 6515

plproxy() { # plproxy VERSION [FILTER]: a router server (PL/Proxy) and two partitions (rate_limit), then
  # tests/plproxy.rs (those whose names contain FILTER)
  local v=$1 filter=${2:-} i servers=() status=0 dir
  for i in 0 1 2; do
    dir="$TEST_ROOT/${PLPROXY_SERVERS[i]}-$v"
    cluster_stop "$v" "$dir"
    rm -rf "$dir"
    if [ "$i" = 0 ]; then
      cluster_start "$v" "$dir" "$(plproxy_port "$v" "$i")" "fsync = off"
    else
      cluster_start "$v" "$dir" "$(plproxy_port "$v" "$i")" "fsync = off" \
        "shared_preload_libraries = 'rate_limit'" "rate_limit.purge_interval = 0"
    fi
    servers+=("$(conninfo "$(plproxy_port "$v" "$i")")")
  done
  dir="$TEST_ROOT/${PLPROXY_SERVERS[2]}-$v"
  RATE_LIMIT_TEST_PLPROXY="$(IFS=';'; echo "${servers[*]}")" \
  RATE_LIMIT_TEST_PLPROXY_PARTITION1_STOP="$(pg_ctl_command "$v" "$dir" stop)" \
  RATE_LIMIT_TEST_PLPROXY_PARTITION1_START="$(pg_ctl_command "$v" "$dir" start)" \
  RATE_LIMIT_TEST_PLPROXY_PARTITION1_DATA="$dir" \
    cargo test -p rate_limit_integration --test plproxy -- --test-threads=1 $filter || status=$?
  for i in 0 1 2; do cluster_stop "$v" "$TEST_ROOT/${PLPROXY_SERVERS[i]}-$v"; done
  return "$status"
}

failover() { # failover VERSION: a primary and a standby (scripts/failover-pair.sh), promoted under load
  RATE_LIMIT_TEST_FAILOVER="$ROOT/scripts/failover-pair.sh $1" \
  RATE_LIMIT_TEST_FAILOVER_PRIMARY="$(conninfo $((6100 + $1)))" \
  RATE_LIMIT_TEST_FAILOVER_STANDBY="$(conninfo $((6150 + $1)))" \
    cargo test -p rate_limit_integration --test failover -- --test-threads=1 --nocapture
}

doc_examples() { # doc_examples VERSION: the documents' example blocks against a fresh default cluster
  local v=$1 dir="$TEST_ROOT/docs-$1" port=$((6000 + $1)) status=0
  cluster_stop "$v" "$dir"
  rm -rf "$dir"
  cluster_start "$v" "$dir" "$port" "fsync = off" "shared_preload_libraries = 'rate_limit'"
  python3 scripts/doc-examples.py --check "$(pg_bindir "$v")/psql" "$(conninfo "$port")" || status=$?
  cluster_stop "$v" "$dir"
  return "$status"
}

clients() { # clients VERSION: the node-postgres client test against the main cluster
  RATE_LIMIT_TEST_CONNINFO="$(conninfo $((5500 + $1)))" node --test tests/clients/
}

portable() { # portable VERSION: the portable edition without the library (scripts/portable-test.sh)
  local v=$1
  RATE_LIMIT_TEST_FAKETIME_CONNINFO="$(conninfo $((5900 + v)))" \
  RATE_LIMIT_TEST_FAKETIME_FILE="$(faketime_file "$v")" \
  RATE_LIMIT_TEST_FAKETIME_STOP="$(pg_ctl_command "$v" "$TEST_ROOT/faketime-$v" stop)" \
  RATE_LIMIT_TEST_FAKETIME_START="$(pg_ctl_command "$v" "$TEST_ROOT/faketime-$v" start "$(faketime_environment "$v")")" \
    scripts/portable-test.sh "$v"
}

faketime_file() { echo "$TEST_ROOT/faketime-$1.rc"; }

faketime_cluster_start() { # a preloaded cluster whose wall clock follows $(faketime_file VERSION)
  local v=$1 dir="$TEST_ROOT/faketime-$1"
  echo "+0" >"$(faketime_file "$v")"
  chmod 644 "$(faketime_file "$v")"
  cluster_start "$v" "$dir" $((5900 + v)) "fsync = off" "shared_preload_libraries = 'rate_limit'" \
    "rate_limit.purge_interval = 0"
  cluster_stop "$v" "$dir"
  sh -c "$(pg_ctl_command "$v" "$dir" start "$(faketime_environment "$v")")"
}

conninfo() { echo "host=$RATE_LIMIT_SOCKET_DIR port=$1 user=postgres"; }

pg_ctl_command() { # pg_ctl_command VERSION DIR ACTION [ENVIRONMENT]: the shell command that runs `pg_ctl ACTION`
  local cmd="${4:-} ${RATE_LIMIT_SERVER_ENVIRONMENT:-} '$(pg_bindir "$1")/pg_ctl' -D '$2' -l '$2/server.log' -w -t 60 -m fast $3"
  if [ "$(id -u)" = 0 ]; then echo "su postgres -s /bin/bash -c \"$cmd\" >/dev/null"; else echo "$cmd >/dev/null"; fi
}

faketime_environment() { # what the faketime cluster's postmaster runs with
  local lib
  lib=$(dpkg -L libfaketime | grep '/libfaketime.so.1$')
  # monotonic clocks are left alone, as an NTP step or a VM restore leaves them
  echo "LD_PRELOAD='$lib' FAKETIME_TIMESTAMP_FILE='$(faketime_file "$1")' FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1"
}

start_clusters() { # start_clusters VERSION: the four servers the regress and integration tests use
  # no background purge unless a test turns it on: some count what rate_limit.purge() deleted
  local v=$1 preload="shared_preload_libraries = 'rate_limit'" nopurge="rate_limit.purge_interval = 0"
  stop_clusters "$v"
  rm -rf "$TEST_ROOT/cluster-$v" "$TEST_ROOT/standby-$v" "$TEST_ROOT/small-$v" "$TEST_ROOT/plain-$v" \
    "$TEST_ROOT/faketime-$v"
  cluster_start "$v" "$TEST_ROOT/cluster-$v" $((5500 + v)) "fsync = off" "$preload" "$nopurge" \
    "rate_limit.max_buckets = 300000"
  as_pg "'$(pg_bindir "$v")/pg_basebackup' -h '$RATE_LIMIT_SOCKET_DIR' -p $((5500 + v)) -U postgres \
    -D '$TEST_ROOT/standby-$v' -R -X stream"
  echo "port = $((5600 + v))" | as_pg "cat >> '$TEST_ROOT/standby-$v/postgresql.conf'"
  cluster_start "$v" "$TEST_ROOT/standby-$v" $((5600 + v))
  cluster_start "$v" "$TEST_ROOT/small-$v" $((5700 + v)) "fsync = off" "$preload" "$nopurge" "rate_limit.max_buckets = 256"
  cluster_start "$v" "$TEST_ROOT/plain-$v" $((5800 + v)) "fsync = off"
  faketime_cluster_start "$v"
}

stop_clusters() {
  local v=$1 c
  for c in standby cluster small plain faketime docs portable "${CITUS_NODES[@]}" "${PLPROXY_SERVERS[@]}" \
    failover-primary failover-standby; do cluster_stop "$v" "$TEST_ROOT/$c-$v"; done
}

# an interrupted or failed run stops the servers it started (each layer also stops them when it is done)
stop_all() { for v in "${VERSIONS[@]}"; do stop_clusters "$v"; done; }

# The build layers of a version (its #[pg_test]s, its upgrades, its install: they replace the library in its
# installation, so none of its servers may run) need no server of another version: they run in the
# background for the next version while this version's servers are tested (whose tests wait on sleeps and
# clocks about half of the time), in a cargo target directory of their own (the foreground's cargo never
# waits for their lock); the .deb's layer runs there while the last version is tested. A background
# job's output is printed, and its layers counted, when the foreground reaches it.
BUILD_TARGET="$ROOT/target/build-layers"
BG_PID=""
BG_LOG="$TEST_ROOT/background.log"
BG_COUNTS="$TEST_ROOT/background.counts"

build_layers() { # build_layers VERSION
  local v=$1
  stop_clusters "$v"
  step "PostgreSQL $v: unit, property and #[pg_test] tests" \
    cargo pgrx test "pg$v" "${RUNAS[@]}" --pgdata "$TEST_ROOT/pgrx-$v"
  step "PostgreSQL $v: ALTER EXTENSION UPDATE from every released version" scripts/upgrade-test.sh "$v"
  step "PostgreSQL $v: install" \
    cargo pgrx install --pg-config "$(pg_bindir "$v")/pg_config" --features "pg$v" --no-default-features
}

package_layer() { # the Debian package, installed on a Debian 12 system made for the test (debootstrap: root)
  step "PostgreSQL 15: the .deb installs without Rust and runs the seed example" scripts/package-test.sh
}

background() { # background FUNCTION ARGS...: runs it in the background (one job at a time), counting its layers
  rm -f "$BG_COUNTS"
  (
    passed=0 failed=0
    export CARGO_TARGET_DIR="$BUILD_TARGET"
    "$@"
    echo "$passed $failed" >"$BG_COUNTS"
  ) >"$BG_LOG" 2>&1 &
  BG_PID=$!
}

join_background() { # waits for the background job, prints its output and counts its layers
  local p f
  [ -n "$BG_PID" ] || return 0
  wait "$BG_PID" || true
  BG_PID=""
  cat "$BG_LOG"
  if read -r p f <"$BG_COUNTS" 2>/dev/null; then
    passed=$((passed + p)) failed=$((failed + f))
  else
    failed=$((failed + 1)); echo "--- FAILED: the background job ended without counting its layers"
  fi
}

stop_background() {
  [ -n "$BG_PID" ] || return 0
  pkill -TERM -P "$BG_PID" 2>/dev/null || true
  kill "$BG_PID" 2>/dev/null || true
  wait "$BG_PID" 2>/dev/null || true
}
trap 'stop_background; stop_all' EXIT

step "lint" lint
step "the model: unit and property tests without PostgreSQL" cargo test -p rate_limit_model
background build_layers "${VERSIONS[0]}"
for ((i = 0; i < ${#VERSIONS[@]}; i++)); do
  v=${VERSIONS[i]}
  join_background
  start_clusters "$v"
  if [ $((i + 1)) -lt ${#VERSIONS[@]} ]; then
    background build_layers "${VERSIONS[i + 1]}"
  elif [[ " ${VERSIONS[*]} " == *" 15 "* ]] && [ "$(id -u)" = 0 ]; then
    background package_layer
  fi
  step "PostgreSQL $v: pg_regress examples" regress "$v" $((5500 + v))
  step "PostgreSQL $v: integration tests" integration "$v"
  step "PostgreSQL $v: untyped parameters from node-postgres" clients "$v"
  step "PostgreSQL $v: the portable edition without the library (psql -f, pg_tle, CREATE EXTENSION; examples; integration tests)" \
    portable "$v"
  stop_clusters "$v"
  if [ "$v" -ge 16 ]; then
    step "PostgreSQL $v: Citus, a coordinator and two workers" citus "$v"
  fi
  if [ "$v" = 18 ]; then
    step "PostgreSQL 18: the OCI image for CloudNativePG, mounted through extension_control_path" \
      scripts/image-test.sh
  fi
  if [ "$v" -le 14 ]; then
    step "PostgreSQL $v: PL/Proxy, the router's functions against look-alikes (CREATE on public for every role)" \
      plproxy "$v" router_functions_ignore_every_look_alike
  fi
  if [ "$v" = 15 ]; then
    step "PostgreSQL 15: PL/Proxy, a router and two partitions" plproxy "$v"
    step "PostgreSQL 15: a standby promoted under load (sync, async, clock 1 h off)" failover "$v"
    step "PostgreSQL 15: the examples in README.md and docs/ are what docs/examples/*.sql print" doc_examples "$v"
  fi
done
join_background

echo
echo "took $((SECONDS / 60)) min $((SECONDS % 60)) s"
echo "summary: $passed passed, $failed failed"
[ "$failed" = 0 ]
