# Per-key overrides at a million keys, measured in one run (issue #40). In both stores, three policies:
#   plain_STORE   no override;
#   sparse_STORE  1 000 000 overrides, one key in ten of the bench's (key10, key20 ... key10000000);
#   every_STORE   1 000 000 overrides, every key of the bench's (key1 ... key1000000).
# Measured:
#   - setting each policy's 1 000 000 overrides in one statement (set_override per row), then clearing and
#     setting again 100 000 of them, each one statement: the time of each (linear, not quadratic);
#   - take on random keys of 1 000 000 (pgbench -M prepared, BENCH_CLIENTS clients, BENCH_ROUNDS interleaved
#     rounds of BENCH_SECONDS, the policies taking turns to go first), as a ratio to SELECT 1 of the same
#     round and to the plain policy of the same round;
#   - the private memory of 100 backends after each took 1 000 random keys (every_memory against
#     plain_memory), from /proc/PID/smaps_rollup;
#   - the cost of one change to the others: 100 backends that called every_memory; each round, the owner
#     commits one set_override, and the sum over the backends of their next take's time less their take's
#     time just before it.
# One release build of this tree in its own copy of the tests' PostgreSQL 15 (never the tests' or the
# demo's installation). Writes bench/results/overrides_million_keys.md.
#
#   bench/run.sh overrides                (about 20 minutes, 3 of them compiling)
#   BENCH_ROUNDS=3 BENCH_SECONDS=5 bench/run.sh overrides

SECONDS_PER_ROUND=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-5}
CLIENTS=${BENCH_CLIENTS:-8}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-overrides}
PORT=5447
OUT="$ROOT/bench/out"
RAW="$OUT/overrides_raw.tsv"
FACTS="$OUT/overrides_facts.tsv"
mkdir -p "$OUT" "$DIR"
: >"$RAW"
: >"$FACTS"

pg15=$(dirname "$(pg_bindir 15)")
pg_bindir() { case $1 in overrides) echo "$DIR/build/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
echo "== release build of $(git rev-parse --short HEAD)"
cluster_stop overrides "$DIR/data"
bench_install "$DIR/build" "$ROOT" "$DIR/target" "$pg15"
rm -rf "$DIR/data"
cluster_start overrides "$DIR/data" "$PORT" "max_connections = 200" "shared_preload_libraries = 'rate_limit'" \
  "rate_limit.max_buckets = 4000000" "rate_limit.purge_interval = 0"
trap 'cluster_stop overrides "$DIR/data"' EXIT
sql() { psql_at overrides "$PORT" -d bench -qAt "$@"; }
timed() { # timed LABEL SQL: runs SQL, appends LABEL and its milliseconds to $FACTS
  local ms
  ms=$(sql -c '\timing on' -c "$2" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1)
  printf '%s\t%s\n' "$1" "$ms" >>"$FACTS"
  echo "  $1: $ms ms"
}

echo "== policies, and 1 000 000 overrides each for sparse_* and every_*"
psql_at overrides "$PORT" -d postgres -qc "CREATE DATABASE bench"
sql -c "CREATE EXTENSION rate_limit"
for store in memory table; do
  # one token a second, a burst of a million: no bucket is denied or full while the bench runs; an
  # overridden key gets a burst of two million
  for p in plain sparse every; do
    sql -c "SELECT rate_limit.create_policy('${p}_$store', 1, '1 second', burst => 1000000, store => '$store')" >/dev/null
  done
  timed "set 1000000 sparse_$store" "SELECT count(rate_limit.set_override('sparse_$store', 'key' || (g * 10),
    burst => 2000000)) FROM generate_series(1, 1000000) AS g"
  timed "set 1000000 every_$store" "SELECT count(rate_limit.set_override('every_$store', 'key' || g,
    burst => 2000000)) FROM generate_series(1, 1000000) AS g"
done
timed "clear 100000 sparse_memory" "SELECT count(rate_limit.clear_override('sparse_memory', 'key' || (g * 10)))
  FROM generate_series(1, 100000) AS g"
timed "set 100000 sparse_memory" "SELECT count(rate_limit.set_override('sparse_memory', 'key' || (g * 10),
  burst => 2000000)) FROM generate_series(1, 100000) AS g"
sql -c "VACUUM ANALYZE"
# the database's filter of overridden keys is built by its first call after the server starts
timed "first call after a start (filter of 4000000 overrides built)" \
  "SELECT allowed FROM rate_limit.take('sparse_memory', 'key1')"
timed "second call" "SELECT allowed FROM rate_limit.take('sparse_memory', 'key2')"

run() { # run ROUND POLICY: one round of take on random keys of POLICY
  local round=$1 policy=$2 out tps
  out=$(PGOPTIONS="-c synchronous_commit=off" "$(pg_bindir overrides)/pgbench" -n -M prepared \
    -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" \
    -D "policy=$policy" -f "$ROOT/bench/scenarios/overrides/take_random.sql" bench 2>&1) ||
    { echo "$out" >&2; echo "pgbench failed: $policy" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
  printf '%s\t%s\t%s\n' "$round" "$policy" "${tps:-0}" >>"$RAW"
  echo "  round $round $policy: ${tps:-?}"
}

echo "== $ROUNDS rounds of $SECONDS_PER_ROUND s, $CLIENTS clients"
for round in $(seq 1 "$ROUNDS"); do
  out=$("$(pg_bindir overrides)/pgbench" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
    -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" -f "$ROOT/bench/scenarios/select1.sql" bench 2>&1)
  printf '%s\t%s\t%s\n' "$round" select1 "$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)" >>"$RAW"
  order=(plain sparse every)
  for ((i = 0; i < round % 3; i++)); do order=("${order[@]:1}" "${order[0]}"); done
  for store in memory table; do
    for p in "${order[@]}"; do run "$round" "${p}_$store"; done
  done
done

CONN="host=$RATE_LIMIT_SOCKET_DIR port=$PORT user=postgres dbname=bench"
echo "== the private memory of 100 backends after 1 000 keys each"
for policy in plain_memory every_memory; do
  printf '%s\t%s\n' "memory $policy" "$(/usr/bin/python3 bench/setup/overrides_backends.py memory "$CONN" "$policy" 100 1000)" >>"$FACTS"
  tail -1 "$FACTS"
done
echo "== what one change costs 100 other backends (µs, each of 10 rounds)"
printf '%s\t%s\n' "change every_memory" "$(/usr/bin/python3 bench/setup/overrides_backends.py change "$CONN" every_memory 100 10 | paste -sd' ')" >>"$FACTS"
tail -1 "$FACTS"

/usr/bin/python3 - "$RAW" "$FACTS" "bench/run.sh overrides (BENCH_ROUNDS=$ROUNDS BENCH_SECONDS=$SECONDS_PER_ROUND BENCH_CLIENTS=$CLIENTS)" \
  "$(git rev-parse --short HEAD)" "$(nproc)" "$CLIENTS" >"$ROOT/bench/results/overrides_million_keys.md" <<'PY'
import statistics, sys
from collections import defaultdict
from datetime import datetime, timezone
raw, facts, command, head, cores, clients = sys.argv[1:7]
tps = defaultdict(dict)
for line in open(raw):
    rnd, scenario, t = line.rstrip("\n").split("\t")
    tps[scenario][int(rnd)] = float(t)
fact = dict(line.rstrip("\n").split("\t", 1) for line in open(facts))
rounds = sorted(tps["select1"])
med = lambda k: statistics.median(tps[k].values())
print("# Per-key overrides at a million keys\n")
print(f"Produced by `{command}` at {head} on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: a {cores}-core Debian 12")
print("VM, PostgreSQL 15 (built from Debian's source package), release build, pgbench -M prepared,")
print(f"synchronous_commit = off, {clients} clients, random keys of 1 000 000. `sparse`: 1 000 000 overrides, one")
print("key in ten of the bench's; `every`: 1 000 000 overrides, every key of the bench's. Medians of the")
print("interleaved rounds; each round's ratio to the plain policy of the same round listed.\n")
print("| store | policy | TPS | × SELECT 1 | × the same take without overrides (median) | each round |")
print("| --- | --- | ---: | ---: | ---: | --- |")
s1 = med("select1")
for store in ("memory", "table"):
    for p in ("plain", "sparse", "every"):
        k, base = f"{p}_{store}", f"plain_{store}"
        per = [tps[k][r] / tps[base][r] for r in rounds]
        print(f"| {store} | {p} | {med(k):,.0f} | {med(k) / s1:.2f} | {statistics.median(per):.2f} | "
              f"{', '.join(f'{x:.2f}' for x in per)} |")
print(f"\n`SELECT 1`: {s1:,.0f} TPS (median). Goal: with 1 000 000 overrides present ≥ 0.90 of without.\n")
print("Setting and clearing, one statement each (`set_override` / `clear_override` per row):\n")
print("| statement | time | per override |")
print("| --- | ---: | ---: |")
for label, ms in fact.items():
    if label.startswith(("set ", "clear ")):
        n = int(label.split()[1])
        print(f"| {label} | {float(ms) / 1000:.1f} s | {float(ms) * 1000 / n:.1f} µs |")
print()
for label in ("first call after a start (filter of 4000000 overrides built)", "second call"):
    print(f"- {label}: {float(fact[label]):.1f} ms")
print("\nPrivate memory of 100 backends after each took 1 000 random keys (Private_Clean + Private_Dirty of")
print("/proc/PID/smaps_rollup; shared buffers are not private):\n")
print("| policy | total | per backend (median, min–max) |")
print("| --- | ---: | ---: |")
for policy in ("plain_memory", "every_memory"):
    total, median, lo, hi = fact[f"memory {policy}"].split()
    print(f"| {policy} | {int(total) / 1024:.1f} MB | {float(median) / 1024:.2f} MB ({int(lo) / 1024:.2f}–{int(hi) / 1024:.2f}) |")
rounds_us = [int(x) for x in fact["change every_memory"].split()]
print("\nOne change of an override, committed by the owner, costs the 100 other backends (the sum of their")
print("next take's time less their take's just before, µs):", ", ".join(str(x) for x in rounds_us),
      f"— median {statistics.median(rounds_us) / 1000:.2f} ms for the 100, "
      f"{statistics.median(rounds_us) / 100:.0f} µs each.")
PY
cat "$ROOT/bench/results/overrides_million_keys.md"
