# The portable edition against the compiled edition's table store and the seed's PL/pgSQL function, in one
# run (issue #41). One release build of this tree in its own copy of the tests' PostgreSQL 15 (never the
# tests' or the demo's installation) and one server, the library preloaded; two databases filled alike
# (100 000 keys of rate_limiting_request and of a token-bucket policy, and the seed's table):
#   compiled   CREATE EXTENSION rate_limit (the table store: rate_limit.store = 'table')
#   portable   portable/rate_limit_portable.sql, run by the database's owner (a role without superuser)
#   portable_noset   the same file without its entry points' `SET enable_seqscan = off`: what that clause
#              costs a call (the fast paths had no SET clause before it)
# Every scenario runs in each round (pgbench -M prepared, BENCH_CLIENTS clients, synchronous_commit off,
# BENCH_ROUNDS rounds of BENCH_SECONDS, the scenarios' order rotating by round): SELECT 1, then
# rate_limiting_request and take on 100 000 random keys (mostly granted) and on one hot key (mostly
# denied) in both editions, the seed's function on both, and two floors (bench/setup/portable_floors.sql: the
# least a role-safe PL/pgSQL function does for a goal). Each figure is a ratio to the SELECT 1 of its
# round; the goals are ratios of two scenarios of the same round, reported as the median with the lowest
# and highest round. Writes bench/results/portable.md.
#
#   bench/run.sh portable                   (about 20 minutes, 5 of them compiling)
#   BENCH_ROUNDS=3 BENCH_SECONDS=5 bench/run.sh portable

SECONDS_PER_ROUND=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-5}
CLIENTS=${BENCH_CLIENTS:-8}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-portable}
PORT=5448
OUT="$ROOT/bench/out"
RAW="$OUT/portable_raw.tsv"
mkdir -p "$OUT" "$DIR"
: >"$RAW"

pg15=$(dirname "$(pg_bindir 15)")
pg_bindir() { case $1 in portable_bench) echo "$DIR/build/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
echo "== release build of $(git rev-parse --short HEAD)"
cluster_stop portable_bench "$DIR/data"
bench_install "$DIR/build" "$ROOT" "$DIR/target" "$pg15"
rm -rf "$DIR/data"
cluster_start portable_bench "$DIR/data" "$PORT" "max_connections = 100" \
  "shared_preload_libraries = 'rate_limit'" "rate_limit.purge_interval = 0"
trap 'cluster_stop portable_bench "$DIR/data"' EXIT
sql() { local db=$1; shift; psql_at portable_bench "$PORT" -d "$db" -q "$@"; }

echo "== two databases, 100 000 keys each"
sql postgres -c "CREATE ROLE bench_owner LOGIN" -c "CREATE DATABASE compiled" \
  -c "CREATE DATABASE portable OWNER bench_owner" -c "CREATE DATABASE portable_noset OWNER bench_owner"
sql compiled -c "CREATE EXTENSION rate_limit"
sql portable -U bench_owner -1 -f "$ROOT/portable/rate_limit_portable.sql" -f "$ROOT/bench/setup/portable_floors.sql"
# the same edition without its entry points' SET enable_seqscan = off (what that clause costs a call)
grep -vx 'SET enable_seqscan = off' "$ROOT/portable/rate_limit_portable.sql" |
  sql portable_noset -U bench_owner -1 -v ON_ERROR_STOP=1 -f -
# the seed's function, SECURITY DEFINER, over its own table (bench/setup/portable_floors.sql)
sed -e 's/baseline_rate_limiting_request/rate_limit.bench_seed_definer/g' \
  -e 's/baseline_rate_limit\b/rate_limit.bench_seed_state/g' \
  -e 's/LANGUAGE plpgsql AS/LANGUAGE plpgsql SECURITY DEFINER AS/' "$ROOT/bench/setup/baseline.sql" |
  sql portable -U bench_owner -1 -v ON_ERROR_STOP=1 -f - \
    -c "SELECT count(rate_limit.bench_seed_definer('key' || g, 2, 60)) FROM generate_series(1, 100000) g"
for db in compiled portable portable_noset; do
  sql "$db" -f "$ROOT/bench/setup/baseline.sql" \
    -c "SELECT rate_limit.create_policy('bench', 2, '1 second', 120)" \
    -c "SELECT count(baseline_rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
    -c "SELECT baseline_rate_limiting_request('hot', 2, 60)" \
    -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench', 'key' || g) d" \
    -c "VACUUM ANALYZE"
done

# scenario database pgbench-script
SCENARIOS=(
  "select1 compiled select1.sql"
  "request_random compiled extension_random.sql"
  "request_random portable extension_random.sql"
  "take_random compiled take_random.sql"
  "take_random portable take_random.sql"
  "request_hot compiled extension_hot.sql"
  "request_hot portable extension_hot.sql"
  "take_hot compiled take_hot.sql"
  "take_hot portable take_hot.sql"
  "request_random portable_noset extension_random.sql"
  "take_random portable_noset take_random.sql"
  "request_hot portable_noset extension_hot.sql"
  "take_hot portable_noset take_hot.sql"
  "baseline_random portable baseline_random.sql"
  "baseline_hot portable baseline_hot.sql"
  "take_floor_hot portable take_floor_hot.sql"
  "seed_definer_random portable seed_definer_random.sql"
)
round() { # round DATABASE SCRIPT: one pgbench run; prints its TPS
  local out
  out=$(PGOPTIONS="-c synchronous_commit=off -c rate_limit.store=table" \
    "$(pg_bindir portable_bench)/pgbench" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
    -c "$CLIENTS" -j 2 -T "$SECONDS_PER_ROUND" -f "$ROOT/bench/scenarios/$2" "$1" 2>&1) ||
    { echo "$out" >&2; return 1; }
  sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1
}
n=${#SCENARIOS[@]}
for ((r = 1; r <= ROUNDS; r++)); do
  echo "== round $r of $ROUNDS"
  for ((i = 0; i < n; i++)); do
    # SELECT 1 first in every round, the others rotating
    if [ "$i" = 0 ]; then j=0; else j=$((1 + (i - 1 + r) % (n - 1))); fi
    read -r scenario db script <<<"${SCENARIOS[$j]}"
    tps=$(round "$db" "$script")
    printf '%s\t%s\t%s\t%s\n' "$r" "$scenario" "$db" "$tps" >>"$RAW"
    printf '  %-16s %-9s %10.0f tps\n' "$scenario" "$db" "$tps"
  done
done

python3 - "$RAW" "$ROOT/bench/results/portable.md" "$(git rev-parse --short HEAD)" "$CLIENTS" "$ROUNDS" \
  "$SECONDS_PER_ROUND" <<'PY'
import statistics, sys
raw, out, rev, clients, rounds, seconds = sys.argv[1:]
tps = {}
for line in open(raw):
    r, scenario, db, value = line.split()
    tps[(int(r), scenario, db)] = float(value)
runs = sorted({r for r, _, _ in tps})
def spread(values):
    return f"{statistics.median(values):.2f}× ({min(values):.2f}–{max(values):.2f})"
def ratios(a, b):
    return [tps[(r,) + a] / tps[(r,) + b] for r in runs]
rows = []
for scenario in ["request_random", "take_random", "request_hot", "take_hot", "baseline_random", "baseline_hot",
                 "take_floor_hot", "seed_definer_random"]:
    for db in ["compiled", "portable", "portable_noset"]:
        if (runs[0], scenario, db) in tps:
            rows.append(f"| {scenario} | {db} | {spread(ratios((scenario, db), ('select1', 'compiled')))} |")
goals = [
    ("portable `rate_limiting_request`, random keys, against the compiled table store's", "≥ 0.85×",
     ratios(("request_random", "portable"), ("request_random", "compiled")), 0.85),
    ("portable `take`, random keys, against the compiled table store's", "≥ 0.85×",
     ratios(("take_random", "portable"), ("take_random", "compiled")), 0.85),
    ("portable `rate_limiting_request`, hot key, against the seed's PL/pgSQL function", "≥ 2×",
     ratios(("request_hot", "portable"), ("baseline_hot", "portable")), 2.0),
    ("portable `take`, hot key, against the seed's PL/pgSQL function", "≥ 2×",
     ratios(("take_hot", "portable"), ("baseline_hot", "portable")), 2.0),
]
with open(out, "w") as f:
    f.write(f"# The portable edition against the compiled table store and the seed's function\n\n")
    f.write(f"`bench/run.sh portable` at `{rev}`: {clients} clients, {rounds} rounds of {seconds} s, "
            "synchronous_commit off, one server (the library preloaded), three databases filled alike (compiled, "
            "portable, portable_noset). "
            "Median of the rounds (lowest–highest round).\n\n")
    f.write("| goal | target | measured | met |\n| --- | --- | ---: | --- |\n")
    for name, target, values, bound in goals:
        met = "yes" if statistics.median(values) >= bound else "no"
        f.write(f"| {name} | {target} | {spread(values)} | {met} |\n")
    f.write("\nFloors (bench/setup/portable_floors.sql: the least a role-safe PL/pgSQL function does for the goal, "
            "owned by the portable database's owner):\n\n| floor | against | measured |\n| --- | --- | ---: |\n")
    f.write("| `bench_take_floor` (reads the policy and the bucket, decides nothing), hot key | the seed's function, "
            f"hot key | {spread(ratios(('take_floor_hot', 'portable'), ('baseline_hot', 'portable')))} |\n")
    f.write("| `bench_seed_definer` (the seed's function, `SECURITY DEFINER`), random keys | the compiled table "
            f"store's request, random keys | {spread(ratios(('seed_definer_random', 'portable'), ('request_random', 'compiled')))} |\n")
    f.write("\nThe entry points' `SET enable_seqscan = off` (docs/operations.md: plans kept by a session reach a bucket by "
            "its key whatever the table's size): the edition as shipped against the same file without that clause "
            "(database portable_noset), same round:\n\n| call | with ÷ without |\n| --- | ---: |\n")
    for scenario in ["request_random", "take_random", "request_hot", "take_hot"]:
        f.write(f"| {scenario} | {spread(ratios((scenario, 'portable'), (scenario, 'portable_noset')))} |\n")
    f.write("\nEach scenario as a ratio to `SELECT 1` of its round:\n\n| scenario | database | ratio to SELECT 1 |\n"
            "| --- | --- | ---: |\n")
    f.write("\n".join(rows) + "\n")
    f.write("\n`SELECT 1`: " + ", ".join(f"{tps[(r, 'select1', 'compiled')]:.0f}" for r in runs) + " tps by round.\n")
print(open(out).read())
PY
