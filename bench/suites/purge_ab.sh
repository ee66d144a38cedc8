# The background worker's purge under load, this build against an earlier revision's, in one run: each
# build in its own copy of PostgreSQL 15 with its own server, purging every BENCH_PURGE_INTERVAL seconds
# (default 10) while pgbench takes from 100 000 random keys of policy `bench` (2 per second, burst 120: each
# key refills within half a second of a call, so its bucket is full at almost every instant) in the table
# store. Beside them, 100 000 buckets of policy `bench_idle` made once and never called again. Each round
# starts with two purge intervals of the same calls, untimed (the purge is off during the other build's
# rounds, so every key is idle when a round starts, and its first purge deletes them all in both builds).
#
# Reported per build (median over BENCH_ROUNDS rounds, default 3, of BENCH_SECONDS s, default 60, the two
# builds' rounds interleaved): TPS against the same server's SELECT 1; the lowest one-second TPS of the round
# against the round's TPS (pgbench -P 1: how deep the dips are); how often a caller was seen waiting for a
# row lock the purge holds (pg_stat_activity sampled every 0.2 s: callers among pg_blocking_pids of the
# `rate_limit purge` worker's victims, summed over the samples); the rows of the state table deleted (by the
# purge) and inserted (by callers whose bucket was missing) over the round (pg_stat_user_tables) and the rows
# left at its end. The
# baseline revision (default 8744e72) deletes every full row, in batches of 5 000 locked until each batch
# commits; this build deletes only rows full and untouched for a purge interval, 1 000 rows read per
# transaction. Writes bench/results/purge_ab.md.
#
#   bench/run.sh purge_ab                                     (about 20 minutes with both builds to compile)
#   BENCH_ROUNDS=3 BENCH_SECONDS=60 BENCH_PURGE_INTERVAL=10 BENCH_BASELINE_REV=8744e72 bench/run.sh purge_ab

SECONDS_PER_ROUND=${BENCH_SECONDS:-60}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
INTERVAL=${BENCH_PURGE_INTERVAL:-10}
BASELINE_REV=${BENCH_BASELINE_REV:-8744e72}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-ab}
declare -A PORT=([new]=5445 [baseline]=5446)
OUT="$ROOT/bench/out"
RAW="$OUT/purge_raw.tsv"
mkdir -p "$OUT" "$DIR"
: >"$RAW"

bench_start_two_builds "$BASELINE_REV"

for b in new baseline; do
  psql_at "$b" "${PORT[$b]}" -d postgres -qc "CREATE DATABASE bench"
  psql_at "$b" "${PORT[$b]}" -d bench -q -c "CREATE EXTENSION rate_limit" \
    -c "SELECT rate_limit.create_policy('bench', 2, '1 second', 120, store => 'table')" \
    -c "SELECT rate_limit.create_policy('bench_idle', 2, '1 second', 120, store => 'table')" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench', 'key' || g) d" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench_idle', 'key' || g) d" \
    -c "VACUUM ANALYZE" >/dev/null
done

PGBENCH="$(pg_bindir new)/pgbench"
# sql BUILD QUERY: one value from the build's bench database
sql() { psql_at "$1" "${PORT[$1]}" -d bench -qAtc "$2"; }
churn() { # churn BUILD: rows of the state table deleted and inserted so far, tab-separated
  sql "$1" "SELECT n_tup_del || E'\t' || n_tup_ins FROM pg_stat_user_tables WHERE relid = 'rate_limit.bucket_state'::regclass"
}
tps_of() { sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$1" | head -1; }

run_select1() { # run_select1 BUILD: SELECT 1's TPS on the build's server
  local out
  out=$("$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "${PORT[$1]}" -U postgres -c "$CLIENTS" -j 2 \
    -T 10 -f bench/scenarios/select1.sql bench 2>&1) || { echo "$out" >&2; exit 1; }
  tps_of "$out"
}

run_takes() { # run_takes BUILD ROUND: one round of takes with the purge on; appends its figures to $RAW
  local build=$1 round=$2 port=${PORT[$1]} out tps lowest blocked rows samples del0 ins0 del1 ins1
  sql "$build" "ALTER SYSTEM SET rate_limit.purge_interval = $INTERVAL" >/dev/null
  sql "$build" "SELECT pg_reload_conf()" >/dev/null
  # untimed, two purge intervals: the keys idle since the other build's round (every key, with the purge
  # off meanwhile) are purged and called again, so that the round measures the purge of a table in use
  PGOPTIONS="-c synchronous_commit=off" "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$port" \
    -U postgres -c "$CLIENTS" -j 2 -T $((2 * INTERVAL + 1)) -f bench/scenarios/take_random.sql bench >/dev/null 2>&1
  sleep 2 # the statistics of the warm-up's connections reach pg_stat_user_tables
  read -r del0 ins0 <<<"$(churn "$build")"
  samples="$OUT/purge_waits_$build.txt"
  : >"$samples"
  (
    end=$(($(date +%s) + SECONDS_PER_ROUND))
    while [ "$(date +%s)" -lt "$end" ]; do
      sql "$build" "SELECT count(*) FROM pg_stat_activity a WHERE a.application_name = 'pgbench' AND EXISTS
        (SELECT FROM pg_stat_activity w WHERE w.backend_type = 'rate_limit purge'
          AND w.pid = ANY (pg_blocking_pids(a.pid)))" >>"$samples" 2>/dev/null || true
      sleep 0.2
    done
  ) &
  out=$(PGOPTIONS="-c synchronous_commit=off" "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$port" \
    -U postgres -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" -P 1 -f bench/scenarios/take_random.sql bench 2>&1) ||
    { echo "$out" >&2; exit 1; }
  wait
  sql "$build" "ALTER SYSTEM SET rate_limit.purge_interval = 0" >/dev/null
  sql "$build" "SELECT pg_reload_conf()" >/dev/null
  tps=$(tps_of "$out")
  lowest=$(sed -n 's/^progress: [0-9.]* s, \([0-9.]*\) tps.*/\1/p' <<<"$out" | sort -g | head -1)
  blocked=$(awk '{s += $1} END {print s + 0}' "$samples")
  sleep 2 # the worker's and the callers' statistics reach pg_stat_user_tables
  read -r del1 ins1 <<<"$(churn "$build")"
  rows=$(sql "$build" "SELECT count(*) FROM rate_limit.bucket_state")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$build" "$(run_select1 "$build")" "$tps" \
    "${lowest:-0}" "$blocked" "$((del1 - del0))" "$((ins1 - ins0))" "$rows" >>"$RAW"
  echo "round $round $build: tps=$tps lowest=$lowest blocked-samples=$blocked deleted=$((del1 - del0)) inserted=$((ins1 - ins0)) rows=$rows"
}

for round in $(seq 1 "$ROUNDS"); do
  for b in new baseline; do run_takes "$b" "$round"; done
done

python3 - "$RAW" "$ROUNDS" "$SECONDS_PER_ROUND" "$CLIENTS" "$INTERVAL" "$(git rev-parse --short HEAD)" "$BASELINE_REV" \
  >bench/results/purge_ab.md <<'PY'
import statistics, sys, platform, os
raw, rounds, seconds, clients, interval, head, base = sys.argv[1:8]
rows = [l.rstrip("\n").split("\t") for l in open(raw)]
by = {}
for r, build, select1, tps, lowest, blocked, deleted, inserted, left in rows:
    by.setdefault(build, []).append((float(select1), float(tps), float(lowest), int(blocked), int(deleted),
                                     int(inserted), int(left)))
def med(v, fmt="{:.3f}"):
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}–{fmt.format(max(v))})"
print("# The background worker's purge under load: this build against the baseline\n")
print(f"Command: `BENCH_ROUNDS={rounds} BENCH_SECONDS={seconds} BENCH_PURGE_INTERVAL={interval} "
      f"BENCH_BASELINE_REV={base} bench/run.sh purge_ab` at {head}; {platform.machine()}, {os.cpu_count()} cores; "
      f"PostgreSQL 15, release builds, each on its own server; pgbench -M prepared, {clients} clients, "
      "synchronous_commit = off, `take('bench', key)` on 100 000 random keys of the table store (each full again "
      "within half a second), beside 100 000 idle buckets; the purge every "
      f"{interval} s during each round of {seconds} s. Figures: median over the rounds (lowest–highest).\n")
print("| build | TPS ÷ SELECT 1 | lowest 1-s TPS ÷ TPS | callers seen waiting for the purge (0.2 s samples) | rows deleted per round | rows inserted per round | rows left |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for build, label in (("new", f"this build ({head})"), ("baseline", f"baseline ({base})")):
    v = by.get(build, [])
    if not v:
        continue
    col = lambda i: med([x[i] for x in v], "{:.0f}")
    print(f"| {label} | {med([x[1] / x[0] for x in v])} | {med([x[2] / x[1] for x in v])} | {col(3)} | "
          f"{col(4)} | {col(5)} | {col(6)} |")
PY
cat bench/results/purge_ab.md
