#!/usr/bin/env bash
# Benchmarks: pgbench against a dedicated PostgreSQL 15 cluster; writes bench/RESULTS.md.
#
#   bench/run.sh                 full run (about 10 minutes)
#   BENCH_SECONDS=2 bench/run.sh quicker, noisier
#
# Scenarios: SELECT 1 (the floor); the PL/pgSQL baseline (bench/baseline.sql, written from the reference
# contract); rate_limiting_request on the table store and on the memory store (rate_limit.store). Hot key
# (one id, mostly denied) and 100 000 random ids (mostly granted); 1, 8 and 32 clients; synchronous_commit
# on and off; SERIALIZABLE hot key with --max-tries. The server preloads rate_limit with
# rate_limit.max_buckets = 1000000, so the report also gives the shared memory of a million buckets.
# Each figure is the median TPS of 3 rounds; ratios compare figures from this same run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh

SECONDS_PER_ROUND=${BENCH_SECONDS:-5}
ROUNDS=3
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out"
mkdir -p "$OUT"
RAW="$OUT/raw.tsv"
: >"$RAW"

cargo pgrx install --release --pg-config "$(pg_bindir 15)/pg_config" \
  --features pg15 --no-default-features >/dev/null
cluster_stop 15 "$DIR/data"
rm -rf "$DIR/data"
cluster_start 15 "$DIR/data" "$PORT" "max_connections = 100" "shared_preload_libraries = 'rate_limit'" \
  "rate_limit.max_buckets = 1000000"
trap 'cluster_stop 15 "$DIR/data"' EXIT
psql_at 15 "$PORT" -d postgres -qc "CREATE DATABASE bench"
psql_at 15 "$PORT" -d bench -q -c "CREATE EXTENSION rate_limit" -f bench/baseline.sql
# 100 000 ids exist in both stores before the random-key scenarios, so they measure steady state
psql_at 15 "$PORT" -d bench -q \
  -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
  -c "SELECT count(baseline_rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
  -c "SET rate_limit.store = 'memory'" \
  -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
  -c "VACUUM ANALYZE"
psql_at 15 "$PORT" -d bench -AtF $'\t' -c "SELECT max_buckets, buckets, slot_bytes, total_bytes, bytes_per_bucket
  FROM rate_limit.memory_usage()" >"$OUT/memory_usage.tsv"

PGBENCH="$(pg_bindir 15)/pgbench"
run() { # run SCENARIO SCRIPT CLIENTS SYNC ISOLATION [STORE]
  local scenario=$1 script=$2 clients=$3 sync=$4 iso=$5 store=${6:-table} round out tps retries
  for round in $(seq 1 $ROUNDS); do
    # PGOPTIONS separates options by spaces: a space inside a value is escaped with a backslash
    out=$(PGOPTIONS="-c synchronous_commit=$sync -c default_transaction_isolation=${iso// /\\ } -c rate_limit.store=$store" \
      "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
      -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T "$SECONDS_PER_ROUND" --max-tries=1000 \
      -f "bench/$script" bench 2>&1) || { echo "$out" >&2; echo "pgbench failed" >&2; exit 1; }
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
    retries=$(sed -n 's/^total number of retries: \([0-9]*\).*/\1/p' <<<"$out")
    committed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$clients" "$sync" "$iso" "${tps:-0}" "${retries:-0}" "${committed:-0}" >>"$RAW"
    echo "$scenario clients=$clients sync=$sync iso=$iso round=$round tps=${tps:-?} retries=${retries:-0}"
  done
}

for clients in 1 8 32; do
  run select1 select1.sql "$clients" on "read committed"
  for sync in on off; do
    for s in extension_hot baseline_hot extension_random baseline_random; do
      run "$s" "$s.sql" "$clients" "$sync" "read committed"
    done
    run memory_hot extension_hot.sql "$clients" "$sync" "read committed" memory
    run memory_random extension_random.sql "$clients" "$sync" "read committed" memory
  done
  run extension_hot extension_hot.sql "$clients" on serializable
  run baseline_hot baseline_hot.sql "$clients" on serializable
  run memory_hot extension_hot.sql "$clients" on serializable memory
done

cluster_stop 15 "$DIR/data"
python3 bench/report.py "$RAW" "$OUT/memory_usage.tsv" "bench/run.sh (BENCH_SECONDS=$SECONDS_PER_ROUND)" \
  >bench/RESULTS.md
echo "wrote bench/RESULTS.md"
