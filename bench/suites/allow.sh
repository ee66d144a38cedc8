# The scalar answer, rate_limit.allow, against rate_limiting_request and take on the same 100 000 random
# keys (memory store, mostly granted), and what each costs an application's own primary-key lookup when
# joined into it: allow in its WHERE, take in its FROM and in its select list. On the server bench/run.sh
# sets up (release build, its own copy of PostgreSQL 15, 1 000 000 memory buckets), with a table
# bench_docs of 100 000 rows. Writes bench/results/allow.md.
#
#   bench/run.sh allow                                  (about 15 minutes with the release build: 9 scenarios
#                                                        × BENCH_ROUNDS rounds of BENCH_SECONDS s)
#   BENCH_ROUNDS=7 BENCH_SECONDS=10 BENCH_CLIENTS=8 bench/run.sh allow
#
# Every figure is a ratio within one round (to that round's SELECT 1, or to that round's bare lookup):
# rounds are interleaved, so drift of this noisy machine cancels out. Goals (issue 42): allow at least
# 0.95 of rate_limiting_request; allow costing at most 10% of the lookup's throughput. Then, without round
# trips, the server's CPU per lookup with and without the limit (an additive bound of that cost).
SECONDS_PER_ROUND=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-5}
CLIENTS=${BENCH_CLIENTS:-8}
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out"
RAW="$OUT/allow.tsv"
mkdir -p "$OUT"

BENCH_SETUP_ONLY=1 bench/run.sh every_call >"$OUT/allow-setup.log"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
pg_bindir() { case $1 in bench) echo "$DIR/pg/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
trap 'cluster_stop bench "$DIR/data"' EXIT

# the application's table (a primary-key lookup is the query the limit is joined into) and the CPU loop below
psql_at bench "$PORT" -d bench -q -f bench/setup/allow_lookup.sql

# scenario  pgbench script
SCENARIOS=(
  "select1 select1.sql"
  "request extension_random.sql"
  "take take_random.sql"
  "take_select take_select_random.sql"
  "allow allow/allow_random.sql"
  "lookup allow/lookup.sql"
  "lookup_allow allow/lookup_allow.sql"
  "lookup_take_from allow/lookup_take_from.sql"
  "lookup_take_select allow/lookup_take_select.sql"
)
PGBENCH="$(pg_bindir bench)/pgbench"
: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for s in "${SCENARIOS[@]}"; do
    read -r scenario script <<<"$s"
    out=$(PGOPTIONS="-c rate_limit.store=memory" \
      "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
      -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" -f "bench/scenarios/$script" bench 2>&1) ||
      { echo "$out" >&2; echo "pgbench failed" >&2; exit 1; }
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
    printf '%s\t%s\t%s\n' "$round" "$scenario" "${tps:-0}" >>"$RAW"
    echo "round $round $scenario tps=${tps:-?}"
  done
done

# The server's CPU for one lookup with and without the limit, without round trips: 100 000 lookups of one
# backend in a PL/pgSQL loop (bench_lookup_us of bench/setup/allow_lookup.sql, which builds every kind's key
# outside its statement), the kinds alternating, BENCH_ROUNDS times. The difference is what the limit adds
# to a lookup's CPU, whatever the client and the network cost; the report gives it as a share of one lookup
# transaction's CPU in the run (the machine's cores over the lookup's TPS), an additive bound of the
# throughput it costs. bench/suites/allow_instructions.sh counts the same loop's instructions instead.
CPU="$OUT/allow-cpu.tsv"
: >"$CPU"
for round in $(seq 1 "$ROUNDS"); do
  for kind in lookup lookup_allow lookup_take_from; do
    us=$(PGOPTIONS="-c rate_limit.store=memory" psql_at bench "$PORT" -d bench -Atc "SELECT bench_lookup_us('$kind', 100000)")
    printf '%s\t%s\t%s\n' "$round" "$kind" "$us" >>"$CPU"
  done
done

python3 - "$RAW" "$ROUNDS" "$SECONDS_PER_ROUND" "$CLIENTS" "$(git rev-parse --short HEAD)" "$CPU" \
  >bench/results/allow.md <<'PY'
import statistics, sys, platform, os
raw, rounds, seconds, clients, head, cpu = sys.argv[1:7]
tps = {}
for line in open(raw):
    r, s, v = line.rstrip("\n").split("\t")
    tps[(int(r), s)] = float(v)
R = sorted({k[0] for k in tps})
def ratios(a, b):
    return [tps[(r, a)] / tps[(r, b)] for r in R]
def fmt(v):
    return f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"
print("# The scalar answer: rate_limit.allow\n")
print(f"Command: `BENCH_ROUNDS={rounds} BENCH_SECONDS={seconds} BENCH_CLIENTS={clients} bench/run.sh allow` "
      f"at {head}; {platform.machine()}, {os.cpu_count()} cores; PostgreSQL 15, release build, memory store, "
      f"100 000 random keys (mostly granted), pgbench -M prepared over Unix sockets, {clients} clients; "
      "rounds interleaved. Figures: median over the rounds (lowest–highest round).\n")
print("| statement | TPS ÷ SELECT 1 |")
print("| --- | --- |")
for s, label in [("request", "`SELECT rate_limiting_request('key' || :k, 2, 60)`"),
                 ("take", "`SELECT allowed FROM rate_limit.take('bench', 'key' || :k)`"),
                 ("take_select", "`SELECT (rate_limit.take('bench', 'key' || :k)).allowed`"),
                 ("allow", "`SELECT rate_limit.allow('bench', 'key' || :k)`"),
                 ("lookup", "`SELECT body FROM bench_docs WHERE id = :k` (the application's lookup)"),
                 ("lookup_allow", "… `WHERE id = :k AND rate_limit.allow('bench', 'key' || :k)`"),
                 ("lookup_take_from", "… `FROM bench_docs AS d, rate_limit.take(…) AS t WHERE d.id = :k AND t.allowed`"),
                 ("lookup_take_select", "… `SELECT d.body, (rate_limit.take(…)).allowed FROM bench_docs AS d WHERE d.id = :k`")]:
    print(f"| {label} | {fmt(ratios(s, 'select1'))} |")
vs_request = ratios("allow", "request")
print("\n| goal | measured (same round) | |")
print("| --- | --- | --- |")
m = statistics.median(vs_request)
print(f"| allow ≥ 0.95 × rate_limiting_request | {fmt(vs_request)} | {'met' if m >= 0.95 else 'NOT met'} |")
for s, label in [("lookup_allow", "allow in the lookup's WHERE"),
                 ("lookup_take_from", "take in the lookup's FROM"),
                 ("lookup_take_select", "take in the lookup's select list")]:
    cost = [1 - x for x in ratios(s, "lookup")]
    c = statistics.median(cost)
    goal = f"{'met' if c <= 0.10 else 'NOT met'} (goal ≤ 10%)" if s == "lookup_allow" else "for comparison"
    print(f"| {label}: throughput lost | {100 * c:.1f}% ({100 * min(cost):.1f}–{100 * max(cost):.1f}%) | {goal} |")
us = {}
for line in open(cpu):
    r, kind, v = line.rstrip("\n").split("\t")
    us.setdefault(kind, []).append(float(v))
lookup_tps = statistics.median(tps[(r, "lookup")] for r in R)
budget = (os.cpu_count() or 2) * 1e6 / lookup_tps
print("\nThe server's CPU per lookup without round trips (100 000 lookups in a PL/pgSQL loop of one backend, "
      "the kinds alternating, median of the rounds), and what the limit adds as a share of one lookup "
      f"transaction's CPU in this run ({budget:.1f} µs: {os.cpu_count()} cores at {lookup_tps:,.0f} TPS):\n")
print("| statement | µs per lookup | added by the limit | share of a lookup transaction |")
print("| --- | --- | --- | --- |")
base = statistics.median(us["lookup"])
print(f"| the lookup | {base:.2f} | | |")
for kind, label in [("lookup_allow", "with `rate_limit.allow` in its WHERE"),
                    ("lookup_take_from", "with `rate_limit.take` in its FROM")]:
    m = statistics.median(us[kind])
    print(f"| {label} | {m:.2f} | {m - base:+.2f} | {100 * (m - base) / budget:.1f}% |")
PY
cat bench/results/allow.md
