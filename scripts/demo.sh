#!/usr/bin/env bash
# The main job: build and install rate_limit into Debian's PostgreSQL 15, start a local cluster with it, run
# the seed example and leave the server running. Idempotent: a second run rebuilds only what changed, restarts
# the server on the new library and recreates the demo database's extension.
#
# It installs only what it needs (scripts/install-deps.sh --demo: no PostgreSQL built for the tests, no
# `cargo pgrx init`): pgrx reads the system's pg_config from PGRX_PG_CONFIG_PATH, and the build has a target
# directory of its own (target/demo), so it neither needs nor disturbs the tests' installations.
#
# Data: $RATE_LIMIT_DEMO_DIR (default /var/tmp/rate_limit-demo), port $RATE_LIMIT_DEMO_PORT (default 5440),
# socket directory $RATE_LIMIT_SOCKET_DIR (default /var/tmp/rate_limit-sock).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --demo
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=cluster.sh
source scripts/cluster.sh

DEMO_DIR=${RATE_LIMIT_DEMO_DIR:-/var/tmp/rate_limit-demo}
PORT=${RATE_LIMIT_DEMO_PORT:-5440}
PG_CONFIG="$(pg_bindir system)/pg_config"
export PGRX_PG_CONFIG_PATH=$PG_CONFIG CARGO_TARGET_DIR=$PWD/target/demo

echo "== building and installing rate_limit (release) into PostgreSQL 15"
# Build first, then stop the demo server (if a previous run left it up) before the install overwrites the library
# it has mapped: replacing a loaded shared library in place crashes the server that uses it.
cargo pgrx package --pg-config "$PG_CONFIG" --features pg15 --no-default-features >/dev/null
cluster_stop system "$DEMO_DIR/data"
cargo pgrx install --release --pg-config "$PG_CONFIG" --features pg15 --no-default-features >/dev/null

echo "== starting the cluster in $DEMO_DIR/data on port $PORT"
cluster_start system "$DEMO_DIR/data" "$PORT"
# preload the library so that the memory store can be tried too (SET rate_limit.store = 'memory')
psql_at system "$PORT" -d postgres -qc "ALTER SYSTEM SET shared_preload_libraries = 'rate_limit'"
# the restart loads the preloaded library, and new backends the library just installed
as_pg "'$(pg_bindir system)/pg_ctl' -D '$DEMO_DIR/data' -l '$DEMO_DIR/data/server.log' -w -m fast restart" >/dev/null

if ! psql_at system "$PORT" -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = 'rate_limit_demo'" | grep -q 1; then
  psql_at system "$PORT" -d postgres -qc "CREATE DATABASE rate_limit_demo"
fi
psql_at system "$PORT" -d rate_limit_demo -q -c "SET client_min_messages = warning" \
  -c "DROP EXTENSION IF EXISTS rate_limit" -c "CREATE EXTENSION rate_limit"

echo "== the seed example"
psql_at system "$PORT" -d rate_limit_demo -f examples/seed.sql

cat <<TXT

The server keeps running. Connect with:
    psql -h $RATE_LIMIT_SOCKET_DIR -p $PORT -U postgres rate_limit_demo
Stop it with:
    su postgres -c "$(pg_bindir system)/pg_ctl -D $DEMO_DIR/data stop"
TXT
