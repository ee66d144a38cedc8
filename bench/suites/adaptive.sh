# Adaptive concurrency against fixed leases and takes, call by call, in both stores: on the server
# bench/run.sh sets up (release build, its own copy of PostgreSQL 15, 1 000 000 memory buckets), 100 000
# random keys. Writes bench/results/adaptive.md.
#
#   bench/run.sh adaptive                               (about 9 minutes: 5 scenarios × 2 stores ×
#                                                        BENCH_ROUNDS rounds of BENCH_SECONDS s)
#
# Scenarios, each a pgbench transaction: SELECT 1; two takes of policy `bench` (a lease's round is two
# statements' worth: acquire, then release); an acquire and its release (reporting 'ok', 1 ms) of the
# fixed concurrency policy `bench_fixed` (4 leases of 1 s, in the store under test: the setup's `bench_jobs`
# is the memory store's); the same of `bench_adaptive` (the same numbers,
# latency_target 1 s: a good report at the limit's most writes nothing, the healthy case); the same
# reporting 2 s, slower than the target, so that every release cuts and writes the key's limit (the worst
# case: a backend in trouble). Every figure is a ratio within one round (rounds interleaved). Goal (issue
# 43): each new call at least 0.85 of take: an adaptive round (acquire and release) against two takes;
# and, as the price of adapting, against the fixed policy's round. pgbench -M prepared over Unix sockets,
# synchronous_commit = off.
SECONDS_PER_ROUND=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-5}
CLIENTS=${BENCH_CLIENTS:-8}
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out"
RAW="$OUT/adaptive.tsv"
mkdir -p "$OUT"

BENCH_SETUP_ONLY=1 bench/run.sh every_call >"$OUT/adaptive-setup.log"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
pg_bindir() { case $1 in bench) echo "$DIR/pg/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
trap 'cluster_stop bench "$DIR/data"' EXIT
psql_at bench "$PORT" -d bench -qAtc \
  "SELECT rate_limit.create_policy('bench_adaptive', 4, '1 second', algorithm => 'concurrency',
                                   options => '{\"latency_target\": \"1 second\"}')
   WHERE NOT EXISTS (SELECT FROM rate_limit.policies WHERE name = 'bench_adaptive')" >/dev/null
psql_at bench "$PORT" -d bench -qAtc \
  "SELECT rate_limit.create_policy('bench_fixed', 4, '1 second', algorithm => 'concurrency')
   WHERE NOT EXISTS (SELECT FROM rate_limit.policies WHERE name = 'bench_fixed')" >/dev/null

# scenario  pgbench script
SCENARIOS=(
  "select1 select1.sql"
  "take_take reservations/take_take_random.sql"
  "fixed adaptive/fixed_round_random.sql"
  "adaptive adaptive/adaptive_round_random.sql"
  "adaptive_cut adaptive/adaptive_cut_random.sql"
)
: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for store in table memory; do
    for s in "${SCENARIOS[@]}"; do
      read -r scenario script <<<"$s"
      tps=$(bench_round bench "$PORT" "$CLIENTS" "$scenario" "$store" "$script")
      printf '%s\t%s\t%s\t%s\n' "$round" "$store" "$scenario" "$tps" >>"$RAW"
      echo "round $round store=$store $scenario tps=$tps"
    done
  done
done

python3 - "$RAW" "$ROUNDS" "$SECONDS_PER_ROUND" "$CLIENTS" "$(git rev-parse --short HEAD)" \
  >bench/results/adaptive.md <<'PY'
import statistics, sys, platform, os
raw, rounds, seconds, clients, head = sys.argv[1:6]
tps = {}
for line in open(raw):
    r, store, s, v = line.rstrip("\n").split("\t")
    tps[(int(r), store, s)] = float(v)
R = sorted({k[0] for k in tps})
def fmt(v):
    return f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"
print("# Adaptive concurrency against fixed leases and takes\n")
print(f"Command: `BENCH_ROUNDS={rounds} BENCH_SECONDS={seconds} BENCH_CLIENTS={clients} bench/run.sh adaptive` "
      f"at {head}; {platform.machine()}, {os.cpu_count()} cores; PostgreSQL 15, release build, 100 000 random "
      f"keys, pgbench -M prepared over Unix sockets, {clients} clients, synchronous_commit = off; rounds "
      "interleaved. Figures: median over the rounds (lowest–highest round).\n")
print("| transaction | store | TPS ÷ SELECT 1 |")
print("| --- | --- | --- |")
labels = [("take_take", "two `take('bench', key)`"),
          ("fixed", "`acquire` and `release` of `bench_fixed` (fixed leases)"),
          ("adaptive", "`acquire` and `release` of `bench_adaptive` (a good report: nothing written)"),
          ("adaptive_cut", "`acquire` and `release` of `bench_adaptive` (a slow report: the limit cut and written)")]
for store in ("table", "memory"):
    for s, label in labels:
        print(f"| {label} | {store} | {fmt([tps[(r, store, s)] / tps[(r, store, 'select1')] for r in R])} |")
print("\n| goal: each new call ≥ 0.85 × take (same round) | store | measured | |")
print("| --- | --- | --- | --- |")
for store in ("table", "memory"):
    for name, s in [("adaptive round ÷ two takes (good report)", "adaptive"),
                    ("adaptive round ÷ two takes (every release cuts)", "adaptive_cut")]:
        v = [tps[(r, store, s)] / tps[(r, store, "take_take")] for r in R]
        m = statistics.median(v)
        print(f"| {name} | {store} | {fmt(v)} | {'met' if m >= 0.85 else 'NOT met'} |")
print("\n| the price of adapting: adaptive round ÷ fixed round (same round) | store | measured |")
print("| --- | --- | --- |")
for store in ("table", "memory"):
    for name, s in [("a good report (the limit read twice, nothing written)", "adaptive"),
                    ("every release cuts (the limit read, locked and written)", "adaptive_cut")]:
        v = [tps[(r, store, s)] / tps[(r, store, "fixed")] for r in R]
        print(f"| {name} | {store} | {fmt(v)} |")
PY
cat bench/results/adaptive.md
