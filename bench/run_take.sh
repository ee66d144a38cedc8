#!/usr/bin/env bash
# The full limiter API against rate_limiting_request, on the same PostgreSQL 15 cluster and store:
# rate_limit.take(policy, key) and a three-policy take(ARRAY[...], key), hot key and 100 000 random keys,
# 8 clients, synchronous_commit = off (so that the table store measures the extension, not fsync), each
# store. Policy 'bench' has exactly the limit of rate_limiting_request(key, 2, 60): 2 per second, burst 120.
# Writes bench/TAKE_RESULTS.md (medians of 3 rounds; ratios within this one run).
#
#   bench/run_take.sh                 (about 5 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh

SECONDS_PER_ROUND=${BENCH_SECONDS:-5}
ROUNDS=3
CLIENTS=8
PORT=${RATE_LIMIT_BENCH_PORT:-5442}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-take}
OUT="$ROOT/bench/out"
mkdir -p "$OUT"
RAW="$OUT/take_raw.tsv"
: >"$RAW"

cargo pgrx install --release --pg-config "$(pg_bindir 15)/pg_config" \
  --features pg15 --no-default-features >/dev/null
cluster_stop 15 "$DIR/data"
rm -rf "$DIR/data"
cluster_start 15 "$DIR/data" "$PORT" "max_connections = 100" "shared_preload_libraries = 'rate_limit'" \
  "rate_limit.max_buckets = 1000000"
trap 'cluster_stop 15 "$DIR/data"' EXIT
psql_at 15 "$PORT" -d postgres -qc "CREATE DATABASE bench"
psql_at 15 "$PORT" -d bench -q -c "CREATE EXTENSION rate_limit" \
  -c "SELECT rate_limit.create_policy('bench', 2, '1 second', 120)" \
  -c "SELECT rate_limit.create_policy('bench_b', 20, '1 second', 1200)" \
  -c "SELECT rate_limit.create_policy('bench_c', 200, '1 second', 12000)"
for store in table memory; do # 100 000 keys exist in every namespace before the random-key scenarios
  psql_at 15 "$PORT" -d bench -q -c "SET rate_limit.store = '$store'" \
    -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g,
          LATERAL rate_limit.take(ARRAY['bench', 'bench_b', 'bench_c'], 'key' || g) d"
done
psql_at 15 "$PORT" -d bench -qc "VACUUM ANALYZE"

PGBENCH="$(pg_bindir 15)/pgbench"
run() { # run SCENARIO SCRIPT STORE
  local scenario=$1 script=$2 store=$3 round out tps
  for round in $(seq 1 $ROUNDS); do
    out=$(PGOPTIONS="-c synchronous_commit=off -c rate_limit.store=$store" \
      "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
      -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" -f "bench/$script" bench 2>&1) ||
      { echo "$out" >&2; echo "pgbench failed" >&2; exit 1; }
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
    printf '%s\t%s\t%s\n' "$scenario" "$store" "${tps:-0}" >>"$RAW"
    echo "$scenario store=$store round=$round tps=${tps:-?}"
  done
}

for store in table memory; do
  # interleaved, so that drift of the machine affects each pair alike
  for shape in random hot; do
    run "request_$shape" "extension_$shape.sql" "$store"
    run "take_$shape" "take_$shape.sql" "$store"
    run "multi3_$shape" "multi3_$shape.sql" "$store"
  done
done
run select1 select1.sql table

cluster_stop 15 "$DIR/data"
python3 - "$RAW" "bench/run_take.sh (BENCH_SECONDS=$SECONDS_PER_ROUND)" >"$ROOT/bench/TAKE_RESULTS.md" <<'PY'
import statistics, sys
from collections import defaultdict
from datetime import datetime, timezone
raw, command = sys.argv[1], sys.argv[2]
tps = defaultdict(list)
for line in open(raw):
    scenario, store, t = line.rstrip("\n").split("\t")
    tps[(scenario, store)].append(float(t))
med = {k: statistics.median(v) for k, v in tps.items()}
print("# Full limiter API: take() against rate_limiting_request\n")
print(f"Produced by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; PostgreSQL 15, 8 clients,")
print("synchronous_commit = off, median TPS of 3 rounds of pgbench -M prepared. Policy `bench` is the limit of")
print("`rate_limiting_request(key, 2, 60)`; multi3 is `take(ARRAY['bench', 'bench_b', 'bench_c'], key)`.")
print(f"`SELECT 1` in the same run: {med.get(('select1', 'table'), float('nan')):,.0f} TPS.\n")
print("| store | keys | rate_limiting_request | take(policy, key) | take / request | multi3 | multi3 / take |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for store in ("table", "memory"):
    for shape in ("random", "hot"):
        r = med.get((f"request_{shape}", store), float("nan"))
        t = med.get((f"take_{shape}", store), float("nan"))
        m = med.get((f"multi3_{shape}", store), float("nan"))
        keys = "100 000 random" if shape == "random" else "one hot key"
        print(f"| {store} | {keys} | {r:,.0f} | {t:,.0f} | {t / r:.2f}× | {m:,.0f} | {m / t:.2f}× |")
print("\nGoals (issue #4): take within 10% of rate_limiting_request on the same store (take / request ≥ 0.90);")
print("multi-limit with 3 policies ≥ 0.5× a single take.")
PY
cat "$ROOT/bench/TAKE_RESULTS.md"
