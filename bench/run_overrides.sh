#!/usr/bin/env bash
# Per-key overrides at scale, measured in one run (issue #30): take on random keys of a policy holding
# 100 000 overrides against the same take on a policy with none, in both stores. The keys are drawn from
# 1 000 000, so one call in ten names an overridden key (its own burst) and the others look the key up in
# the policy's map and find nothing. Also: how long a backend takes to read those 100 000 overrides (its
# first call after a change of the policies or overrides, which every backend pays once).
#
# One release build of this tree in its own copy of the tests' PostgreSQL 15 (never the tests' or the demo's
# installation). BENCH_CLIENTS clients (default 8); rounds are interleaved, the two policies taking turns
# to go first. Writes bench/OVERRIDES_RESULTS.md.
#
#   bench/run_overrides.sh                (about 10 minutes, 5 of them compiling)
#   BENCH_ROUNDS=5 BENCH_SECONDS=10 bench/run_overrides.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
# shellcheck source=lib.sh
source bench/lib.sh

SECONDS_PER_ROUND=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
OVERRIDES=100000
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-overrides}
PORT=5447
OUT="$ROOT/bench/out"
RAW="$OUT/overrides_raw.tsv"
mkdir -p "$OUT" "$DIR"
: >"$RAW"

pg15=$(dirname "$(pg_bindir 15)")
pg_bindir() { case $1 in overrides) echo "$DIR/build/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
echo "== release build of $(git rev-parse --short HEAD)"
cluster_stop overrides "$DIR/data"
bench_install "$DIR/build" "$ROOT" "$DIR/target" "$pg15"
rm -rf "$DIR/data"
cluster_start overrides "$DIR/data" "$PORT" "max_connections = 100" "shared_preload_libraries = 'rate_limit'" \
  "rate_limit.max_buckets = 3000000" "rate_limit.purge_interval = 0"
trap 'cluster_stop overrides "$DIR/data"' EXIT

echo "== policies with and without $OVERRIDES overrides, in both stores"
psql_at overrides "$PORT" -d postgres -qc "CREATE DATABASE bench"
for store in memory table; do
  # one token a second, a burst of a million: no bucket is denied or full while the bench runs; the
  # overridden keys get a burst of two million
  psql_at overrides "$PORT" -d bench -q -c "CREATE EXTENSION IF NOT EXISTS rate_limit" \
    -c "SELECT rate_limit.create_policy('plain_$store', 1, '1 second', burst => 1000000, store => '$store')" \
    -c "SELECT rate_limit.create_policy('over_$store', 1, '1 second', burst => 1000000, store => '$store')" \
    -c "INSERT INTO rate_limit.key_overrides (policy, key, action, burst, set_at)
        SELECT 'over_$store', 'key' || (g * 10), 'limit', 2000000, clock_timestamp()
        FROM generate_series(1, $OVERRIDES) AS g"
done
psql_at overrides "$PORT" -d bench -qc "VACUUM ANALYZE"

run() { # run POLICY: one round of take on random keys of POLICY
  local policy=$1 out tps
  out=$(PGOPTIONS="-c synchronous_commit=off" "$(pg_bindir overrides)/pgbench" -n -M prepared \
    -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" \
    -D "policy=$policy" -f "$ROOT/bench/overrides/take_random.sql" bench 2>&1) ||
    { echo "$out" >&2; echo "pgbench failed: $policy" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
  printf '%s\t%s\t%s\n' "$round" "$policy" "${tps:-0}" >>"$RAW"
  echo "round $round $policy tps=${tps:-?}"
}

select1() {
  local out tps
  out=$("$(pg_bindir overrides)/pgbench" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
    -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" -f "$ROOT/bench/select1.sql" bench 2>&1)
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
  printf '%s\t%s\t%s\n' "$round" select1 "${tps:-0}" >>"$RAW"
  echo "round $round select1 tps=${tps:-?}"
}

for round in $(seq 1 "$ROUNDS"); do
  select1
  for store in memory table; do
    if [ $((round % 2)) = 1 ]; then run "plain_$store"; run "over_$store"; else run "over_$store"; run "plain_$store"; fi
  done
done

echo "== a backend's first call after a change: reading $OVERRIDES overrides"
LOADS="$OUT/overrides_load.txt"
: >"$LOADS"
for i in 1 2 3 4 5; do
  # a change of another policy empties every backend's cache; the new backend's first call reads the
  # policy and its overrides; its second is a cache hit
  psql_at overrides "$PORT" -d bench -qc "SELECT rate_limit.alter_policy('plain_table', burst => 1000000 + $i)"
  psql_at overrides "$PORT" -d bench -qAt -c '\timing on' \
    -c "SELECT allowed FROM rate_limit.take('over_memory', 'key1')" \
    -c "SELECT allowed FROM rate_limit.take('over_memory', 'key2')" |
    sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | paste -sd' ' >>"$LOADS"
done

python3 - "$RAW" "$LOADS" "bench/run_overrides.sh (BENCH_ROUNDS=$ROUNDS BENCH_SECONDS=$SECONDS_PER_ROUND BENCH_CLIENTS=$CLIENTS)" \
  "$(git rev-parse --short HEAD)" "$(nproc)" "$CLIENTS" "$OVERRIDES" >"$ROOT/bench/OVERRIDES_RESULTS.md" <<'PY'
import statistics, sys
from collections import defaultdict
from datetime import datetime, timezone
raw, loads, command, head, cores, clients, n = sys.argv[1:8]
tps = defaultdict(dict)
for line in open(raw):
    rnd, scenario, t = line.rstrip("\n").split("\t")
    tps[scenario][int(rnd)] = float(t)
rounds = sorted(tps["select1"])
def med(k):
    return statistics.median(tps[k].values())
print(f"# Per-key overrides: take with {int(n):,} overrides on the policy against take with none\n")
print(f"Produced by `{command}` at {head} on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: a {cores}-core Debian 12")
print("VM, PostgreSQL 15 (built from Debian's source package), release build, pgbench -M prepared,")
print(f"synchronous_commit = off, {clients} clients, random keys of 1 000 000 (one in ten overridden). Medians of the")
print("interleaved rounds; each round's ratio listed.\n")
print("| store | take, no overrides: TPS (× SELECT 1) | take, overrides: TPS (× SELECT 1) | with / without, median | each round |")
print("| --- | ---: | ---: | ---: | --- |")
s1 = med("select1")
for store in ("memory", "table"):
    p, o = f"plain_{store}", f"over_{store}"
    per_round = [tps[o][r] / tps[p][r] for r in rounds]
    print(f"| {store} | {med(p):,.0f} ({med(p) / s1:.2f}×) | {med(o):,.0f} ({med(o) / s1:.2f}×) | "
          f"{statistics.median(per_round):.2f} | {', '.join(f'{x:.2f}' for x in per_round)} |")
print(f"\n`SELECT 1`: {s1:,.0f} TPS (median). Goal: with / without ≥ 0.90.\n")
first, second = [], []
for line in open(loads):
    parts = [float(x) for x in line.split()]
    if len(parts) >= 2:
        first.append(parts[0]); second.append(parts[1])
if first:
    print(f"A backend's first call after a change (it reads the policy and its {int(n):,} overrides): "
          f"{statistics.median(first):.0f} ms (median of {len(first)}, from a new connection: "
          f"{', '.join(f'{x:.0f}' for x in first)} ms); its next call: {statistics.median(second):.2f} ms.")
PY
cat "$ROOT/bench/OVERRIDES_RESULTS.md"
