# Decisions in bulk, measured in one run (issue #31): rate_limit.take_batch over 100 000 distinct keys against
# take(policy, key) called 100 000 times in one statement (LATERAL over generate_series) and against the bare
# scans those statements make without deciding anything, in both stores; in the table store also against one
# statement that writes the same 100 000 rows (an upsert into a table shaped like the state table). And the
# marginal cost of one take joined into an application's own indexed lookup, with its SELECT 1.
#
# One release build of this tree in its own copy of the tests' PostgreSQL 15 (never the tests' or the demo's
# installation). Bulk statements run from one client: one backend, one core, so statements per second ×
# 100 000 is decisions per second per core. Lookups run from BENCH_CLIENTS clients (default 8). Rounds are
# interleaved; BENCH_HUGE_PAGES=on starts the server with huge_pages = on (the operator reserves them:
# sysctl vm.nr_hugepages), else off. Writes bench/results/batch.md.
#
#   bench/run.sh batch                    (about 15 minutes, 5 of them compiling)
#   BENCH_ROUNDS=5 BENCH_SECONDS=10 BENCH_HUGE_PAGES=on bench/run.sh batch

SECONDS_PER_ROUND=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
HUGE_PAGES=${BENCH_HUGE_PAGES:-off}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-batch}
PORT=5445
OUT="$ROOT/bench/out"
RAW="$OUT/batch_raw.tsv"
mkdir -p "$OUT" "$DIR"
: >"$RAW"

pg15=$(dirname "$(pg_bindir 15)")
pg_bindir() { case $1 in batch) echo "$DIR/batch/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
echo "== release build of $(git rev-parse --short HEAD)"
cluster_stop batch "$DIR/data"
bench_install "$DIR/batch" "$ROOT" "$DIR/target" "$pg15"
rm -rf "$DIR/data"
cluster_start batch "$DIR/data" "$PORT" "max_connections = 100" "shared_preload_libraries = 'rate_limit'" \
  "rate_limit.max_buckets = 1000000" "huge_pages = $HUGE_PAGES" "work_mem = '64MB'"
trap 'cluster_stop batch "$DIR/data"' EXIT

echo "== 100 000 keys in both stores, an account table, the upsert's table"
psql_at batch "$PORT" -d postgres -qc "CREATE DATABASE bench"
# one token a second, a burst of a million: no bucket is denied or full (and purged) while the bench runs
psql_at batch "$PORT" -d bench -q -c "CREATE EXTENSION rate_limit" \
  -c "SELECT rate_limit.create_policy('bench_wide_memory', 1, '1 second', burst => 1000000, store => 'memory')" \
  -c "SELECT rate_limit.create_policy('bench_wide_table', 1, '1 second', burst => 1000000, store => 'table')" \
  -c "CREATE TABLE bench_batch AS SELECT array_agg('key' || g ORDER BY g) AS keys FROM generate_series(1, 100000) g" \
  -c "CREATE TABLE bench_accounts (id int PRIMARY KEY, name text NOT NULL)" \
  -c "INSERT INTO bench_accounts SELECT g, 'key' || g FROM generate_series(1, 100000) g" \
  -c "CREATE TABLE bench_rows (LIKE rate_limit.bucket_state INCLUDING ALL)" \
  -f "$ROOT/bench/scenarios/batch/take_batch_memory.sql" -f "$ROOT/bench/scenarios/batch/take_batch_table.sql" \
  -f "$ROOT/bench/scenarios/batch/upsert_rows.sql" -c "VACUUM ANALYZE"

run() { # run SCENARIO CLIENTS: one round
  local scenario=$1 clients=$2 script out tps
  script="$ROOT/bench/scenarios/batch/$scenario.sql"
  [ -f "$script" ] || script="$ROOT/bench/scenarios/$scenario.sql"
  out=$(PGOPTIONS="-c synchronous_commit=off" "$(pg_bindir batch)/pgbench" -n -M prepared \
    -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres -c "$clients" -j "$((clients < 2 ? 1 : 2))" \
    -T "$SECONDS_PER_ROUND" -f "$script" bench 2>&1) ||
    { echo "$out" >&2; echo "pgbench failed: $scenario" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
  printf '%s\t%s\t%s\t%s\n' "$round" "$scenario" "$clients" "${tps:-0}" >>"$RAW"
  echo "$scenario clients=$clients tps=${tps:-?}"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round"
  for scenario in take_batch_memory take_series_memory scan_series scan_array take_batch_table \
    take_series_table upsert_rows; do
    run "$scenario" 1
  done
  run select1 "$CLIENTS"
  for scenario in lookup lookup_take_memory lookup_take_table; do run "$scenario" "$CLIENTS"; done
done

python3 - "$RAW" "bench/run.sh batch (BENCH_ROUNDS=$ROUNDS BENCH_SECONDS=$SECONDS_PER_ROUND BENCH_CLIENTS=$CLIENTS BENCH_HUGE_PAGES=$HUGE_PAGES)" \
  "$(git rev-parse --short HEAD)" "$(nproc)" "$CLIENTS" "$HUGE_PAGES" >"$ROOT/bench/results/batch.md" <<'PY'
import statistics, sys
from collections import defaultdict
from datetime import datetime, timezone
raw, command, head, cores, clients, huge = sys.argv[1:7]
tps = defaultdict(list)
for line in open(raw):
    _, scenario, _, t = line.rstrip("\n").split("\t")
    tps[scenario].append(float(t))
med = {k: statistics.median(v) for k, v in tps.items()}
def rounds(k):
    return ", ".join(f"{x:,.2f}" if x < 100 else f"{x:,.0f}" for x in tps[k])
KEYS = 100_000
def per_s(k):
    return med[k] * KEYS
print("# Decisions in bulk: take_batch against take in one statement, the bare scans, and one upsert\n")
print(f"Produced by `{command}` at {head} on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: a {cores}-core Debian 12")
print("VM, PostgreSQL 15 (built from Debian's source package), release build, synchronous_commit = off,")
print(f"huge_pages = {huge}. Bulk statements over 100 000 distinct keys from one client (one backend on one core):")
print("rows per second = statements per second × 100 000. Medians of the interleaved rounds; every round listed.\n")
print("| statement (100 000 keys) | rows or decisions / s, one core | per row | statements / s, each round |")
print("| --- | ---: | ---: | --- |")
names = {
    "take_batch_memory": "`take_batch` over the array, memory store",
    "take_series_memory": "`take` × 100 000 (LATERAL over generate_series), memory store",
    "scan_series": "bare scan: generate_series and the key text, no decision",
    "scan_array": "bare scan: unnest of the batch's array, no decision",
    "take_batch_table": "`take_batch` over the array, table store",
    "take_series_table": "`take` × 100 000, table store",
    "upsert_rows": "one INSERT … ON CONFLICT DO UPDATE writing the same 100 000 rows",
}
for k, name in names.items():
    if k in med:
        print(f"| {name} | {per_s(k):,.0f} | {1e6 / per_s(k):.2f} µs | {rounds(k)} |")
b, t = per_s("take_batch_memory"), per_s("take_series_memory")
print(f"\nMemory store: `take_batch` decides {b / 1e6:.2f} M keys/s on one core (goal ≥ 2 M), "
      f"{b / t:.1f}× `take` in one statement; its statement costs {1e6 / b - 1e6 / per_s('scan_array'):.2f} µs per key more "
      f"than unnesting the same array.")
bt, u = per_s("take_batch_table"), per_s("upsert_rows")
print(f"Table store: `take_batch` {bt:,.0f} keys/s, {bt / per_s('take_series_table'):.1f}× `take` in one statement, "
      f"{bt / u:.2f}× one upsert of the same rows.\n")
s1, l = med["select1"], med["lookup"]
print(f"An application's indexed lookup with one `take` joined in ({clients} clients, random ids of 100 000):\n")
print("| query | TPS | × SELECT 1 | × the lookup alone | rounds |")
print("| --- | ---: | ---: | ---: | --- |")
for k, name in (("select1", "`SELECT 1`"), ("lookup", "`SELECT name FROM bench_accounts WHERE id = :id`"),
                ("lookup_take_memory", "the lookup with `take` joined, memory store"),
                ("lookup_take_table", "the lookup with `take` joined, table store")):
    print(f"| {name} | {med[k]:,.0f} | {med[k] / s1:.2f}× | {med[k] / l:.2f}× | {rounds(k)} |")
print(f"\nThe marginal cost of the joined `take`: {(1 - med['lookup_take_memory'] / l) * 100:.0f}% of the lookup's "
      f"throughput in the memory store, {(1 - med['lookup_take_table'] / l) * 100:.0f}% in the table store.")
PY
cat "$ROOT/bench/results/batch.md"
