# One core for every call, measured in one run: take(policy, key) against rate_limiting_request on the same
# store, a three-policy take_many against a single take, and rate_limiting_request of this build against the
# build of an earlier revision (default: the last main before the one-core change), hot key and 100 000
# random keys, both stores, synchronous_commit = off (the table store measures the extension, not fsync).
#
# The two builds run side by side, each in its own copy of the tests' PostgreSQL 15 (one installation cannot
# hold two builds of one library), each cluster with its own SELECT 1; rounds are interleaved so that drift
# of this noisy machine affects every figure alike. Policy 'bench' has exactly the limit of
# rate_limiting_request(key, 2, 60). Writes bench/results/one_core_ab.md (medians of BENCH_ROUNDS rounds, default 3, with their spread).
#
#   bench/run.sh one_core_ab                                    (about 15 minutes with both builds to compile)
#   BENCH_CLIENTS=32 BENCH_ROUNDS=5 BENCH_BASELINE_REV=<rev> bench/run.sh one_core_ab

SECONDS_PER_ROUND=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
BASELINE_REV=${BENCH_BASELINE_REV:-d7f9333}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-core}
declare -A PORT=([new]=5443 [baseline]=5444)
OUT="$ROOT/bench/out"
RAW="$OUT/core_raw.tsv"
mkdir -p "$OUT" "$DIR"
: >"$RAW"

bench_start_two_builds "$BASELINE_REV"

echo "== preparing 100 000 keys in every namespace of both stores"
psql_at new "${PORT[new]}" -d postgres -qc "CREATE DATABASE bench"
psql_at new "${PORT[new]}" -d bench -q -c "CREATE EXTENSION rate_limit" \
  -c "SELECT rate_limit.create_policy('bench', 2, '1 second', 120)" \
  -c "SELECT rate_limit.create_policy('bench_b', 20, '1 second', 1200)" \
  -c "SELECT rate_limit.create_policy('bench_c', 200, '1 second', 12000)"
psql_at baseline "${PORT[baseline]}" -d postgres -qc "CREATE DATABASE bench"
psql_at baseline "${PORT[baseline]}" -d bench -qc "CREATE EXTENSION rate_limit"
for store in table memory; do
  psql_at new "${PORT[new]}" -d bench -q -c "SET rate_limit.store = '$store'" \
    -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g,
          LATERAL rate_limit.take_many(ARRAY['bench', 'bench_b', 'bench_c'], ARRAY['key' || g]) d"
  psql_at baseline "${PORT[baseline]}" -d bench -q -c "SET rate_limit.store = '$store'" \
    -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g"
done
for b in new baseline; do psql_at "$b" "${PORT[$b]}" -d bench -qc "VACUUM ANALYZE"; done

PGBENCH="$(pg_bindir new)/pgbench"
run() { # run BUILD SCENARIO SCRIPT STORE: one round
  local build=$1 scenario=$2 script=$3 store=$4 out tps
  out=$(PGOPTIONS="-c synchronous_commit=off -c rate_limit.store=$store" \
    "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "${PORT[$build]}" -U postgres \
    -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" -f "bench/scenarios/$script" bench 2>&1) ||
    { echo "$out" >&2; echo "pgbench failed" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
  printf '%s\t%s\t%s\t%s\n' "$build" "$scenario" "$store" "${tps:-0}" >>"$RAW"
  echo "$build $scenario store=$store tps=${tps:-?}"
}

for round in $(seq 1 $ROUNDS); do
  echo "== round $round"
  run new select1 select1.sql table
  run baseline select1 select1.sql table
  for store in table memory; do
    for shape in random hot; do
      run baseline "request_$shape" "extension_$shape.sql" "$store"
      run new "request_$shape" "extension_$shape.sql" "$store"
      run new "take_$shape" "take_$shape.sql" "$store"
      run new "multi3_$shape" "multi3_$shape.sql" "$store"
    done
  done
done

python3 - "$RAW" "bench/run.sh one_core_ab (BENCH_CLIENTS=$CLIENTS BENCH_ROUNDS=$ROUNDS BENCH_BASELINE_REV=$BASELINE_REV BENCH_SECONDS=$SECONDS_PER_ROUND)" \
  "$CLIENTS" "$BASELINE_REV" "$(nproc)" "$(git rev-parse --short HEAD)" "$ROUNDS" "$SECONDS_PER_ROUND" >"$ROOT/bench/results/one_core_ab.md" <<'PY'
import statistics, sys
from collections import defaultdict
from datetime import datetime, timezone
raw, command, clients, baseline, cores, head, rounds, seconds = sys.argv[1:9]
tps = defaultdict(list)
for line in open(raw):
    build, scenario, store, t = line.rstrip("\n").split("\t")
    tps[(build, scenario, store)].append(float(t))
med = {k: statistics.median(v) for k, v in tps.items()}
def m(*k):
    return med.get(k, float("nan"))
def spread(*k):
    v = tps.get(k, [])
    if not v:
        return ""
    mid = statistics.median(v)
    return f"±{max(abs(x - mid) for x in v) / mid * 100:.0f}%"
s1, s1b = m("new", "select1", "table"), m("baseline", "select1", "table")
print("# One core for every call: take, take_many and rate_limiting_request in one run\n")
print(f"Produced by `{command}` at {head} on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: a {cores}-core")
print(f"Debian 12 VM, PostgreSQL 15 (built from Debian's source package), {clients} clients, pgbench -M prepared,")
print(f"synchronous_commit = off, median TPS of {rounds} interleaved {seconds}-second rounds (± is the largest deviation of a")
print(f"round from the median). The baseline is the release build of `{baseline}` (the last main before the")
print("change) in its own copy of the same PostgreSQL, with its own `SELECT 1`.\n")
print(f"`SELECT 1`: {s1:,.0f} TPS (this build's cluster, {spread('new', 'select1', 'table')}), "
      f"{s1b:,.0f} TPS (baseline's cluster, {spread('baseline', 'select1', 'table')}).\n")
print("| store | keys | request, baseline | request | take(policy, key) | take_many, 3 policies |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for store in ("table", "memory"):
    for shape in ("random", "hot"):
        keys = "100 000 random" if shape == "random" else "one hot key"
        ob, r = m("baseline", f"request_{shape}", store), m("new", f"request_{shape}", store)
        t, mu = m("new", f"take_{shape}", store), m("new", f"multi3_{shape}", store)
        print(f"| {store} | {keys} | {ob:,.0f} ({ob / s1b:.2f}×) {spread('baseline', f'request_{shape}', store)} "
              f"| {r:,.0f} ({r / s1:.2f}×) {spread('new', f'request_{shape}', store)} "
              f"| {t:,.0f} ({t / s1:.2f}×) {spread('new', f'take_{shape}', store)} "
              f"| {mu:,.0f} ({mu / s1:.2f}×) {spread('new', f'multi3_{shape}', store)} |")
print("\n(× is the ratio to `SELECT 1` on the same cluster in this run.)\n")
print("| store | keys | take / request (goal ≥ 0.9) | take_many / take (goal ≥ 0.5) | request vs baseline, both × SELECT 1 (goal ≥ 1, within noise) |")
print("| --- | --- | ---: | ---: | ---: |")
for store in ("table", "memory"):
    for shape in ("random", "hot"):
        keys = "100 000 random" if shape == "random" else "one hot key"
        ob, r = m("baseline", f"request_{shape}", store), m("new", f"request_{shape}", store)
        t, mu = m("new", f"take_{shape}", store), m("new", f"multi3_{shape}", store)
        print(f"| {store} | {keys} | {t / r:.2f}× | {mu / t:.2f}× | {(r / s1) / (ob / s1b):.2f}× |")
PY
cat "$ROOT/bench/results/one_core_ab.md"
