# Every call of bench/run.sh, this build against an earlier revision's (default: ea5bfac, main before
# issue #28), measured in one run. A call the baseline lacks (bench_fill could not create its policy there) is
# measured in the new build only. Each build runs in its own copy of the tests' PostgreSQL 15 with its own
# `SELECT 1`, filled alike (bench/lib.sh); rounds are interleaved, the builds taking turns to go first, so drift of this noisy machine affects
# both builds alike. Writes bench/results/ab_every_call.md: per call, each build's median ratio to its `SELECT 1` over
# the rounds, and new / baseline with the lowest and highest round.
#
#   bench/run.sh ab                                   (about 30 minutes with both builds to compile)
#   BENCH_BASELINE_REV=<rev> BENCH_CLIENTS=32 BENCH_ROUNDS=5 BENCH_SECONDS=5 bench/run.sh ab
#   BENCH_ONLY="take_random calendar_hot" bench/run.sh ab   only these calls (and SELECT 1), e.g. to measure
#                                                           again with more rounds the ones that moved

SECONDS_PER_ROUND=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
BASELINE_REV=${BENCH_BASELINE_REV:-ea5bfac}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-ab}
declare -A PORT=([new]=5445 [baseline]=5446)
OUT="$ROOT/bench/out"
RAW="$OUT/ab_raw.tsv"
mkdir -p "$OUT" "$DIR"

bench_start_two_builds "$BASELINE_REV"
echo "== 100 000 keys in every namespace of both stores, in both builds"
for b in new baseline; do bench_fill "$b" "${PORT[$b]}"; done

: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for s in "${BENCH_SCENARIOS[@]}"; do
    read -r scenario store script <<<"$s"
    case $scenario in baseline_*) continue ;; esac # PL/pgSQL: the same in both builds
    if [ -n "${BENCH_ONLY:-}" ] && [ "$scenario" != select1 ] && [[ " $BENCH_ONLY " != *" $scenario "* ]]; then
      continue
    fi
    # the builds take turns going first, so that what a round's first minutes do (a purge, a checkpoint)
    # does not always land on the same one
    order="new baseline"
    [ $((round % 2)) = 0 ] && order="baseline new"
    for b in $order; do
      bench_lacks "$b" "$scenario" && continue
      tps=$(bench_round "$b" "${PORT[$b]}" "$CLIENTS" "$scenario" "$store" "$script")
      printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$b" "$scenario" "$store" "$tps" >>"$RAW"
      echo "round $round $b $scenario store=$store tps=$tps"
    done
  done
done

python3 - "$RAW" "bench/run.sh ab (${BENCH_ONLY:+BENCH_ONLY=\"$BENCH_ONLY\" }BENCH_BASELINE_REV=$BASELINE_REV BENCH_CLIENTS=$CLIENTS BENCH_ROUNDS=$ROUNDS BENCH_SECONDS=$SECONDS_PER_ROUND)" \
  "$(git rev-parse --short HEAD)" "$BASELINE_REV" "$(nproc)" >"$ROOT/bench/results/ab_every_call.md" <<'PY'
import statistics, sys
from collections import defaultdict
from datetime import datetime, timezone
raw, command, head, baseline, cores = sys.argv[1:6]
tps = {}
order = []
for line in open(raw):
    rnd, build, scenario, store, t = line.rstrip("\n").split("\t")
    tps[(int(rnd), build, scenario, store)] = float(t)
    if (scenario, store) not in order:
        order.append((scenario, store))
rounds = sorted({k[0] for k in tps})
def ratio(r, build, scenario, store):
    a, b = tps.get((r, build, scenario, store)), tps.get((r, build, "select1", "-"))
    return a / b if a is not None and b else None
def reference(scenario, store):
    """The plain `take` a call is compared with in its own build: same store, same hot or random keys."""
    return ("take_hot" if scenario.endswith("_hot") else "take_random", store)
print(f"# Every call, {head} against {baseline}, in one run\n")
print(f"Produced by `{command}` at {head} on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: a {cores}-core Debian 12")
print("VM, PostgreSQL 15 (built from Debian's source package), pgbench -M prepared, synchronous_commit = off, 100 000")
print("keys in every namespace. Each build in its own copy of PostgreSQL with its own `SELECT 1`; rounds interleaved.")
print("A call's ratio is its TPS over its build's `SELECT 1` in the same round; new / baseline is taken per round")
print("and summarised as the median (lowest–highest round). 1.00 is no change; this machine's noise is about ±10%.")
print("The last column is the call's TPS over the new build's `take` on the same store and the same (hot or random)")
print("keys, in the same round. \"—\": the baseline lacks that call.\n")
print("| call | store | baseline × SELECT 1 | new × SELECT 1 | new / baseline | new / new `take` |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for scenario, store in order:
    if scenario == "select1":
        continue
    base = [x for r in rounds if (x := ratio(r, "baseline", scenario, store)) is not None]
    new = [x for r in rounds if (x := ratio(r, "new", scenario, store)) is not None]
    rel = [n / b for r in rounds
           if (n := ratio(r, "new", scenario, store)) is not None and (b := ratio(r, "baseline", scenario, store))]
    ref = reference(scenario, store)
    to_take = [n / t for r in rounds
               if (n := tps.get((r, "new", scenario, store))) and (t := tps.get((r, "new", *ref)))]
    if not new:
        continue
    summary = lambda xs: f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})" if xs else "—"
    print(f"| {scenario} | {store} | {f'{statistics.median(base):.2f}×' if base else '—'} "
          f"| {statistics.median(new):.2f}× | {summary(rel)} | {summary(to_take)} |")
s1 = {b: statistics.median([tps[(r, b, 'select1', '-')] for r in rounds]) for b in ("new", "baseline")}
print(f"\n`SELECT 1`: {s1['new']:,.0f} TPS (new), {s1['baseline']:,.0f} TPS (baseline), {len(rounds)} rounds.")
PY
cat "$ROOT/bench/results/ab_every_call.md"
