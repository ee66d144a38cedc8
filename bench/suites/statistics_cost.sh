# The cost of the statistics: the memory store's hot-key and random-key calls with rate_limit.track_stats
# on (the default) and off, in one run, interleaved, on the server bench/run.sh sets up (release build, its
# own copy of PostgreSQL 15, 1 000 000 memory buckets, 100 000 keys). Writes bench/results/statistics_cost.md.
#
#   bench/run.sh statistics_cost                       (about 15 minutes with the release build: 9 scenarios × 2 client
#                                         counts × BENCH_ROUNDS rounds of BENCH_SECONDS s)
#   BENCH_ROUNDS=5 BENCH_SECONDS=10 bench/run.sh statistics_cost
#
# Every figure is a ratio within one round: a call's TPS over `SELECT 1`'s, and with statistics over
# without (the cost is 1 minus that ratio); the order of each on/off pair alternates between rounds. The
# hot key is mostly denied, so it also measures the top-keys summary, which only denials update.
SECONDS_PER_ROUND=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-5}
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out"
RAW="$OUT/stats.tsv"
mkdir -p "$OUT"

BENCH_SETUP_ONLY=1 bench/run.sh every_call >"$OUT/stats-setup.log"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
pg_bindir() { case $1 in bench) echo "$DIR/pg/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
trap 'cluster_stop bench "$DIR/data"' EXIT

# scenario  track_stats  pgbench script
SCENARIOS=(
  "select1 on select1.sql"
  "request_hot on extension_hot.sql"
  "request_hot off extension_hot.sql"
  "request_random on extension_random.sql"
  "request_random off extension_random.sql"
  "take_hot on take_hot.sql"
  "take_hot off take_hot.sql"
  "take_random on take_random.sql"
  "take_random off take_random.sql"
)
PGBENCH="$(pg_bindir bench)/pgbench"
: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for clients in 8 32; do
    for s in "${SCENARIOS[@]}"; do
      read -r scenario track script <<<"$s"
      # each pair runs on then off in odd rounds, off then on in even ones: a bias of the second run of a
      # pair (warmer caches, a drifting machine) cancels out over the rounds
      if [ $((round % 2)) = 0 ] && [ "$scenario" != select1 ]; then
        case $track in on) track=off ;; off) track=on ;; esac
      fi
      out=$(PGOPTIONS="-c rate_limit.store=memory -c rate_limit.track_stats=$track" \
        "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
        -c "$clients" -j 2 -T "$SECONDS_PER_ROUND" -f "bench/scenarios/$script" bench 2>&1) ||
        { echo "$out" >&2; echo "pgbench failed" >&2; exit 1; }
      tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
      printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$clients" "$scenario" "$track" "${tps:-0}" >>"$RAW"
      echo "round $round clients $clients $scenario track_stats=$track tps=${tps:-?}"
    done
  done
done
psql_at bench "$PORT" -d bench -AtF ' ' -c "SELECT policy, calls, denied FROM rate_limit.stats WHERE policy = 'bench'" \
  >"$OUT/stats-counted.txt"

# The CPU the statistics add to one call, without round trips: 300 000 calls inside one statement of one
# backend (the hot key is denied from the backend's memory after its first denial, the random keys are
# granted), alternating on and off, BENCH_ROUNDS times.
psql_at bench "$PORT" -d bench -q <<'SQL'
CREATE OR REPLACE FUNCTION bench_cpu_us(kind text, n int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  c bigint;
BEGIN
  IF kind = 'hot' THEN
    SELECT count(*) INTO c FROM generate_series(1, n) AS g WHERE rate_limiting_request('cpu_hot', 2, 60) >= 0;
  ELSE
    SELECT count(*) INTO c FROM generate_series(1, n) AS g
    WHERE rate_limiting_request('key' || (g % 100000 + 1), 2, 60) >= 0;
  END IF;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;
SQL
CPU="$OUT/stats-cpu.tsv"
: >"$CPU"
for round in $(seq 1 "$ROUNDS"); do
  for kind in hot random; do
    for track in on off; do
      us=$(PGOPTIONS="-c rate_limit.store=memory -c rate_limit.track_stats=$track" \
        psql_at bench "$PORT" -d bench -Atc "SELECT bench_cpu_us('$kind', 300000)")
      printf '%s\t%s\t%s\t%s\n' "$round" "$kind" "$track" "$us" >>"$CPU"
    done
  done
done

python3 - "$RAW" "$ROUNDS" "$SECONDS_PER_ROUND" "$(git rev-parse --short HEAD)" "$(cat "$OUT/stats-counted.txt")" \
  "$CPU" >bench/results/statistics_cost.md <<'PY'
import statistics, sys, platform, os
raw, rounds, seconds, head, counted, cpu = sys.argv[1:7]
tps = {}
for line in open(raw):
    r, c, s, t, v = line.rstrip("\n").split("\t")
    tps[(int(r), int(c), s, t)] = float(v)
R = sorted({k[0] for k in tps})
def med(vals):
    return statistics.median(vals), min(vals), max(vals)
def fmt(v):
    m, lo, hi = med(v)
    return f"{m:.3f} ({lo:.3f}–{hi:.3f})"
print("# Cost of the statistics (memory store)\n")
print(f"Command: `BENCH_ROUNDS={rounds} BENCH_SECONDS={seconds} bench/run.sh statistics_cost` at {head}; "
      f"{platform.machine()}, {os.cpu_count()} cores; PostgreSQL 15, release build, pgbench -M prepared over "
      "Unix sockets; rounds interleaved. Figures: median over the rounds (lowest–highest round).\n")
print("| call | clients | with statistics ÷ SELECT 1 | without ÷ SELECT 1 | with ÷ without | cost |")
print("| --- | --- | --- | --- | --- | --- |")
worst = 0.0
for scen, label in [("request_hot", "rate_limiting_request, hot key (mostly denied)"),
                    ("request_random", "rate_limiting_request, 100 000 random keys"),
                    ("take_hot", "take(policy, key), hot key (mostly denied)"),
                    ("take_random", "take(policy, key), 100 000 random keys")]:
    for c in (8, 32):
        on = [tps[(r, c, scen, "on")] / tps[(r, c, "select1", "on")] for r in R]
        off = [tps[(r, c, scen, "off")] / tps[(r, c, "select1", "on")] for r in R]
        rel = [tps[(r, c, scen, "on")] / tps[(r, c, scen, "off")] for r in R]
        cost = 1 - statistics.median(rel)
        worst = max(worst, cost)
        print(f"| {label} | {c} | {fmt(on)} | {fmt(off)} | {fmt(rel)} | {100 * cost:+.1f}% |")
pairs = [tps[(r, c, scen, "on")] / tps[(r, c, scen, "off")]
         for r in R for c in (8, 32) for scen in ("request_hot", "request_random", "take_hot", "take_random")]
print(f"\nGoal: at most 5% throughput cost. Largest median cost of a cell: {100 * worst:.1f}% "
      f"({'met' if worst <= 0.05 else 'NOT met'}). Every pair of every cell and round together "
      f"({len(pairs)} pairs): with ÷ without {statistics.median(pairs):.3f}, a cost of "
      f"{100 * (1 - statistics.median(pairs)):+.1f}%.")
us = {}
for line in open(cpu):
    r, kind, track, v = line.rstrip("\n").split("\t")
    us.setdefault((kind, track), []).append(float(v))
# CPU time of one SELECT 1 transaction in this run: both cores over its median TPS at 8 clients
select1 = statistics.median(tps[(r, 8, "select1", "on")] for r in R)
budget = (os.cpu_count() or 2) * 1e6 / select1
print("\nThe CPU the statistics add to one call, measured without round trips (300 000 calls in one "
      "statement of one backend, on and off alternating, median of the rounds), and that CPU as a share "
      f"of the CPU of one `SELECT 1` transaction in this run ({budget:.1f} µs: {os.cpu_count()} cores at "
      f"{select1:,.0f} TPS):\n")
print("| calls | µs per call with statistics | without | added | share of a `SELECT 1` transaction |")
print("| --- | --- | --- | --- | --- |")
for kind, label in [("hot", "one key, denied (from the backend's memory)"),
                    ("random", "100 000 keys, granted")]:
    on, off = statistics.median(us[(kind, "on")]), statistics.median(us[(kind, "off")])
    print(f"| {label} | {on:.3f} | {off:.3f} | {on - off:+.3f} | {100 * (on - off) / budget:+.2f}% |")
print(f"\nCounted during the run for policy `bench` (calls, denied): {counted.split(' ', 1)[-1] if counted else 'n/a'}.")
PY
cat bench/results/statistics_cost.md
