# take_batch in one statement, this tree against a baseline revision, timed inside the server (psql's
# \timing of each statement: no pgbench, no protocol round trips beyond one per statement). One statement
# decides the same 100 000 distinct keys of the memory store (bench/scenarios/batch/take_batch_memory.sql); the two
# builds take turns, BENCH_STATEMENTS statements each per round, for BENCH_ROUNDS rounds, and the first
# statement of each turn (a fresh backend's) is left out. Prints and writes the minimum and median
# milliseconds of each build, and decisions per second at the median (one backend: one core). Then the
# same statement counted in instructions (callgrind), exact where this machine's timings are not: each
# build's server run single-user under valgrind, one statement to warm up and then 1 or 3 more; the
# difference over 2 is one statement's instructions.
#
#   BENCH_BASELINE_REV=424d251 bench/run.sh batch_ab          (about 10 minutes, the two builds included)
#   BENCH_BASELINE_REV=v0.4.0 BENCH_ROUNDS=20 bench/run.sh batch_ab

BASELINE_REV=${BENCH_BASELINE_REV:?name the baseline revision: BENCH_BASELINE_REV=...}
ROUNDS=${BENCH_ROUNDS:-10}
STATEMENTS=${BENCH_STATEMENTS:-5}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-batch-ab}
OUT="$ROOT/bench/results/batch_ab.md"
declare -A PORT=([new]=5447 [baseline]=5448)
mkdir -p "$DIR"
[ "$(id -u)" != 0 ] || chown postgres "$DIR"

bench_start_two_builds "$BASELINE_REV"
for b in new baseline; do
  psql_at "$b" "${PORT[$b]}" -d postgres -qc "CREATE DATABASE bench"
  psql_at "$b" "${PORT[$b]}" -d bench -q -c "CREATE EXTENSION rate_limit" \
    -c "SELECT rate_limit.create_policy('bench_wide_memory', 1, '1 second', burst => 1000000, store => 'memory')" \
    -c "CREATE TABLE bench_batch AS SELECT array_agg('key' || g ORDER BY g) AS keys FROM generate_series(1, 100000) g" \
    -f "$ROOT/bench/scenarios/batch/take_batch_memory.sql" >/dev/null
done

RAW="$DIR/batch_ab_raw.tsv"
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
  for b in new baseline; do
    { echo '\timing on'; for ((s = 0; s <= STATEMENTS; s++)); do cat "$ROOT/bench/scenarios/batch/take_batch_memory.sql"; done; } |
      psql_at "$b" "${PORT[$b]}" -d bench -qAt | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -n +2 |
      sed "s/^/$b\t/" >>"$RAW"
  done
  echo "round $r of $ROUNDS"
done

command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null
statements_instructions() { # statements_instructions BUILD N: the instructions of a warm-up and N statements
  local file="$DIR/batch-$1-$2.callgrind"
  for ((s = 0; s <= $2; s++)); do cat "$ROOT/bench/scenarios/batch/take_batch_memory.sql"; done |
    su postgres -c "valgrind --tool=callgrind --callgrind-out-file=$file $DIR/$1/bin/postgres --single -D $DIR/data-$1 bench" \
      >>"$DIR/single.log" 2>&1
  program_total "$file"
}
declare -A PER_STATEMENT
for b in new baseline; do
  cluster_stop "$b" "$DIR/data-$b"
  PER_STATEMENT[$b]=$((($(statements_instructions "$b" 3) - $(statements_instructions "$b" 1)) / 2))
done

python3 - "$RAW" "$OUT" "$(git rev-parse --short HEAD)" "$BASELINE_REV" "$ROUNDS" "$STATEMENTS" \
  "${PER_STATEMENT[new]}" "${PER_STATEMENT[baseline]}" <<'PY'
import statistics, sys, datetime
raw, out, head, base, rounds, statements, new_instr, base_instr = sys.argv[1:]
ms = {"new": [], "baseline": []}
for line in open(raw):
    label, t = line.split("\t")
    ms[label].append(float(t))
when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
lines = [
    "# take_batch in one statement: this build against a baseline, same run",
    "",
    f"Produced by `BENCH_BASELINE_REV={base} BENCH_ROUNDS={rounds} BENCH_STATEMENTS={statements} "
    f"bench/run.sh batch_ab` at {head} on {when}: PostgreSQL 15 release builds, one statement deciding the",
    "same 100 000 distinct keys of the memory store (1 000 000 buckets, huge_pages off), timed by psql,",
    f"the builds taking turns ({rounds} rounds of {statements} statements each, a fresh backend's first left out).",
    "",
    "| build | statements | min ms | median ms | decisions/s at the median |",
    "| --- | ---: | ---: | ---: | ---: |",
]
for label, name in (("new", head), ("baseline", base)):
    v = ms[label]
    med = statistics.median(v)
    lines.append(f"| {name} | {len(v)} | {min(v):.1f} | {med:.1f} | {100000 / med * 1000:,.0f} |")
ratio = statistics.median(ms["baseline"]) / statistics.median(ms["new"])
lines += ["", f"{head} decides {ratio:.2f}x as many keys per second as {base} at the median."]
new_instr, base_instr = int(new_instr), int(base_instr)
lines += [
    "",
    "The same statement in instructions (callgrind, each build's server single-user, one statement's",
    "instructions: 3 statements minus 1 after a warm-up, over 2):",
    "",
    "| build | instructions per statement | per key |",
    "| --- | ---: | ---: |",
    f"| {head} | {new_instr:,} | {new_instr / 100000:,.0f} |",
    f"| {base} | {base_instr:,} | {base_instr / 100000:,.0f} |",
    "",
    f"{head} runs {new_instr / base_instr:.3f}x the instructions of {base} per statement.",
]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
