# The cost of going past one server, measured in one run on this machine (docs/scaling.md#capacity):
#   - PL/Proxy: a router database (PostgreSQL 15, Debian's PL/Proxy) forwarding to 1, 2 and 4 partitions,
#     against the same call made directly on one partition, with SELECT 1 through the same paths as the floor
#     (directly, and as a PL/Proxy function run on the key's partition);
#   - Citus: a coordinator and two workers (PostgreSQL 17, Citus 14.0.1), the call delegated by Citus from the
#     coordinator, against the same call on a server without Citus, with SELECT 1 through the same paths
#     (directly, and as a distributed PL/pgSQL function delegated by the same key: a SQL function would be
#     inlined by the planner and never reach a worker); and the call sent straight to its key's node (keys
#     that rate_limit.nodes_of places on worker 1) against the same script on the server without Citus, and
#     on a server with Citus loaded and nothing distributed (what Citus's hooks alone cost a statement).
# Every call is rate_limit.take('bench', random key of 100 000) on the table store, synchronous_commit off
# (the figures measure routing, not fsync). Each figure is pgbench's tps with BENCH_CLIENTS clients for
# BENCH_SECONDS, the median of BENCH_ROUNDS interleaved rounds. Writes bench/results/router_hop.md.
#
#   bench/run.sh router_hop                                  (about 15 minutes, release builds included)
#   BENCH_CLIENTS=16 BENCH_ROUNDS=5 bench/run.sh router_hop
#   BENCH_ROUTER_BASELINE=946eb46 bench/run.sh router_hop    also the router's forwarding functions as that
#                                                        revision's router/plproxy.sql made them (a database
#                                                        of their own on the same router server and library)
#
# Its servers are its own (release builds in copies of the tests' PostgreSQL 15 and 17 under
# $RATE_LIMIT_BENCH_DIR, ports 7000-7009 and 7100-7109): the tests' installations are not touched.

SECONDS_PER_ROUND=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench-scale}
OUT="$ROOT/bench/out"
RAW="$OUT/scale_raw.tsv"
mkdir -p "$OUT" "$DIR"
[ "$(id -u)" != 0 ] || chown postgres "$DIR"
: >"$RAW"

# the bench's own installations: b15, b17 (every other label keeps its meaning from cluster.sh)
pg_bindir() { case $1 in b15 | b17) echo "$DIR/$1/bin" ;; system) echo /usr/lib/postgresql/15/bin ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }

install_tree() { # install_tree VERSION: $DIR/bVERSION = the tests' PostgreSQL VERSION + a release build of rate_limit
  local v=$1 tree="$DIR/b$1" pg="$PG_CACHE/$1"
  rm -rf "$tree" "$DIR/pkg-$v"
  cp -a "$pg" "$tree"
  CARGO_TARGET_DIR="$DIR/target" cargo pgrx package --pg-config "$pg/bin/pg_config" --features "pg$v" \
    --no-default-features --out-dir "$DIR/pkg-$v" >/dev/null
  rm -f "$tree"/share/postgresql/extension/rate_limit*
  cp -a "$DIR/pkg-$v$pg/." "$tree/"
  chmod -R a+rX "$tree"
}

SERVERS=()
start() { # start VERSION NAME PORT [conf...]: a fresh server of the bench
  local v=$1 name=$2 port=$3
  shift 3
  cluster_stop "$v" "$DIR/data-$name"
  rm -rf "$DIR/data-$name"
  cluster_start "$v" "$DIR/data-$name" "$port" "fsync = off" "synchronous_commit = off" "max_connections = 200" "$@"
  SERVERS+=("$v:$name")
}
stop_all() { local s; for s in "${SERVERS[@]}"; do cluster_stop "${s%%:*}" "$DIR/data-${s#*:}"; done; }
trap stop_all EXIT

sql() { local v=$1 port=$2 db=$3; shift 3; psql_at "$v" "$port" -d "$db" -qAt "$@"; }

SCRIPTS="$DIR/scripts"
mkdir -p "$SCRIPTS"
cat >"$SCRIPTS/take.sql" <<'EOF'
\set k random(1, 100000)
SELECT allowed FROM rate_limit.take('bench', 'key' || :k);
EOF
cat >"$SCRIPTS/select1.sql" <<'EOF'
SELECT 1;
EOF
cat >"$SCRIPTS/select1_routed.sql" <<'EOF'
\set k random(1, 100000)
SELECT bench_select1('key' || :k);
EOF
chmod -R a+r "$SCRIPTS"

# measure LABEL VERSION PORT DB SCRIPT: one pgbench run, appended to $RAW
measure() {
  local label=$1 v=$2 port=$3 db=$4 script=$5 tps
  tps=$("$(pg_bindir "$v")/pgbench" -n -h "$RATE_LIMIT_SOCKET_DIR" -p "$port" -U postgres -c "$CLIENTS" \
    -j 2 -T "$SECONDS_PER_ROUND" -f "$SCRIPTS/$script" "$db" 2>/dev/null |
    sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1)
  printf '%s\t%s\n' "$label" "${tps:-0}" >>"$RAW"
  echo "  $label: $tps"
}

echo "== release builds for PostgreSQL 15 and 17"
install_tree 15
install_tree 17

echo "== PL/Proxy: four partitions and a router (PostgreSQL 15)"
for i in 1 2 3 4; do
  start b15 "partition$i" $((7000 + i)) "shared_preload_libraries = 'rate_limit'" "rate_limit.purge_interval = 0"
  sql b15 $((7000 + i)) postgres -c "CREATE DATABASE app"
  sql b15 $((7000 + i)) app -c "CREATE EXTENSION rate_limit"
done
# the router's one library is PL/Proxy's, in the bench's copy of PostgreSQL 15 (copied from the tests')
start b15 router 7000
sql b15 7000 postgres -c "CREATE DATABASE router"
sql b15 7000 router -f "$ROOT/router/plproxy.sql" >/dev/null
partitions() { # partitions N: the array literal of the first N partitions
  local i list=()
  for ((i = 1; i <= $1; i++)); do list+=("\"host=$RATE_LIMIT_SOCKET_DIR port=$((7000 + i)) dbname=app\""); done
  echo "{$(IFS=,; echo "${list[*]}")}"
}
router_of() { # router_of N: the router forwards to the first N partitions
  sql b15 7000 router -c "SELECT count(*) FROM rate_limit_router.create_router('rate_limit', '$(partitions "$1")')" >/dev/null
  sql b15 7000 router -c "CREATE OR REPLACE FUNCTION bench_select1(k text) RETURNS integer LANGUAGE plproxy AS
    \$\$ CLUSTER 'rate_limit'; RUN ON pg_catalog.hashtext(k); SELECT 1; \$\$"
  if [ -n "${BENCH_ROUTER_BASELINE:-}" ]; then
    sql b15 7000 router_base -c "SELECT count(*) FROM rate_limit_router.create_router('rate_limit', '$(partitions "$1")')" >/dev/null
  fi
}
if [ -n "${BENCH_ROUTER_BASELINE:-}" ]; then
  sql b15 7000 postgres -c "CREATE DATABASE router_base"
  git -C "$ROOT" show "$BENCH_ROUTER_BASELINE:router/plproxy.sql" | sql b15 7000 router_base >/dev/null
fi
router_of 4
sql b15 7000 router -c "SELECT rate_limit.create_policy('bench', 2, '1 second', burst => 120, store => 'table')" >/dev/null

echo "== Citus: a coordinator and two workers, and a server without Citus (PostgreSQL 17)"
citus_conf=("shared_preload_libraries = 'citus,rate_limit'" "max_prepared_transactions = 200" "rate_limit.purge_interval = 0")
for i in 0 1 2; do
  start b17 "citus$i" $((7100 + i)) "${citus_conf[@]}"
  sql b17 $((7100 + i)) postgres -c "CREATE DATABASE app"
  sql b17 $((7100 + i)) app -c "CREATE EXTENSION citus"
done
sql b17 7100 app -c "SELECT citus_set_coordinator_host('$RATE_LIMIT_SOCKET_DIR', 7100)" \
  -c "SELECT citus_add_node('$RATE_LIMIT_SOCKET_DIR', 7101)" -c "SELECT citus_add_node('$RATE_LIMIT_SOCKET_DIR', 7102)" \
  -c "CREATE EXTENSION rate_limit" -c "SELECT count(*) FROM rate_limit.distribute()" \
  -c "SELECT rate_limit.create_policy('bench', 2, '1 second', burst => 120, store => 'table')" \
  -c "CREATE FUNCTION bench_select1(k text) RETURNS integer LANGUAGE plpgsql AS 'BEGIN RETURN 1; END'" \
  -c "SELECT create_distributed_function('bench_select1(text)', 'k', colocate_with => 'rate_limit.bucket_state', force_delegation => true)" >/dev/null
start b17 single 7109 "shared_preload_libraries = 'rate_limit'" "rate_limit.purge_interval = 0"
sql b17 7109 postgres -c "CREATE DATABASE app"
sql b17 7109 app -c "CREATE EXTENSION rate_limit" \
  -c "SELECT rate_limit.create_policy('bench', 2, '1 second', burst => 120, store => 'table')" >/dev/null
# a server with Citus loaded and nothing distributed: what Citus's hooks alone cost every statement
start b17 single-citus 7108 "shared_preload_libraries = 'citus,rate_limit'" "rate_limit.purge_interval = 0"
sql b17 7108 postgres -c "CREATE DATABASE app"
sql b17 7108 app -c "CREATE EXTENSION citus" -c "CREATE EXTENSION rate_limit" \
  -c "SELECT rate_limit.create_policy('bench', 2, '1 second', burst => 120, store => 'table')" >/dev/null
# straight to the key's node: the keys rate_limit.nodes_of places on worker 1, in a plain table of worker 1
# and of the server without Citus, read by the same two-statement script on both
keys_on_worker1="SELECT row_number() OVER () AS id, substr(key, 4)::int AS n FROM rate_limit.nodes_of(ARRAY(
  SELECT 'key' || i FROM generate_series(1, 100000) AS i)) WHERE port = 7101"
sql b17 7100 app -c "COPY ($keys_on_worker1) TO STDOUT" >"$DIR/keys_on_worker1.tsv"
chmod a+r "$DIR/keys_on_worker1.tsv"
sql b17 7101 app -c "SET citus.enable_ddl_propagation = off" -c "CREATE TABLE bench_keys (id bigint PRIMARY KEY, n int)"
for port in 7108 7109; do sql b17 $port app -c "CREATE TABLE bench_keys (id bigint PRIMARY KEY, n int)"; done
for port in 7101 7108 7109; do sql b17 $port app -c "\\copy bench_keys FROM '$DIR/keys_on_worker1.tsv'"; done
{
  echo "\\set r random(1, $(wc -l <"$DIR/keys_on_worker1.tsv"))"
  echo "SELECT n FROM bench_keys WHERE id = :r \\gset"
} >"$SCRIPTS/local_lookup.sql"
{
  cat "$SCRIPTS/local_lookup.sql"
  echo "SELECT allowed FROM rate_limit.take('bench', 'key' || :n);"
} >"$SCRIPTS/local_take.sql"
chmod a+r "$SCRIPTS/local_take.sql" "$SCRIPTS/local_lookup.sql"

echo "== $ROUNDS rounds of $SECONDS_PER_ROUND s, $CLIENTS clients"
for ((r = 1; r <= ROUNDS; r++)); do
  echo "round $r"
  # a direct call on one partition (what a router's call becomes there), and its floor
  measure "plproxy direct take" b15 7001 app take.sql
  measure "plproxy direct SELECT 1" b15 7001 app select1.sql
  for n in 1 2 4; do
    router_of "$n"
    measure "plproxy router $n take" b15 7000 router take.sql
    measure "plproxy router $n SELECT 1" b15 7000 router select1_routed.sql
    if [ -n "${BENCH_ROUTER_BASELINE:-}" ] && [ "$n" = 1 ]; then
      measure "plproxy router 1 take, baseline forwarding" b15 7000 router_base take.sql
    fi
  done
  measure "citus direct take" b17 7109 app take.sql
  measure "citus direct SELECT 1" b17 7109 app select1.sql
  measure "citus delegated take" b17 7100 app take.sql
  measure "citus delegated SELECT 1" b17 7100 app select1_routed.sql
  measure "citus routed take" b17 7101 app local_take.sql
  measure "single routed-script take" b17 7109 app local_take.sql
  measure "single+citus routed-script take" b17 7108 app local_take.sql
  measure "citus routed lookup" b17 7101 app local_lookup.sql
  measure "single lookup" b17 7109 app local_lookup.sql
  measure "single+citus lookup" b17 7108 app local_lookup.sql
done

python3 - "$RAW" "$ROOT/bench/results/router_hop.md" "$CLIENTS" "$SECONDS_PER_ROUND" "$ROUNDS" <<'EOF'
import statistics, sys
raw, out, clients, seconds, rounds = sys.argv[1:]
runs = {}
for line in open(raw):
    label, tps = line.rstrip("\n").split("\t")
    runs.setdefault(label, []).append(float(tps))
med = {k: statistics.median(v) for k, v in runs.items()}
def row(label, direct, floor):
    m, d, f = med[label], med[direct], med[floor]
    return f"| {label} | {m:,.0f} | {min(runs[label]):,.0f}–{max(runs[label]):,.0f} | {m / d:.2f} | {m / f:.2f} |"
lines = [
    "# Going past one server: the router hop, measured",
    "",
    f"`bench/run.sh router_hop` (BENCH_CLIENTS={clients}, BENCH_SECONDS={seconds}, BENCH_ROUNDS={rounds}), on this",
    "machine (2 cores: every server of a set-up shares them). tps of pgbench, median of the rounds, and its",
    "range; `of direct`: against the same call made directly (one partition; a server without Citus);",
    "`of floor`: against SELECT 1 made directly on that server.",
    "",
    "| path | tps | range | of direct | of floor |",
    "| --- | ---: | ---: | ---: | ---: |",
]
for label in ["plproxy direct take", "plproxy direct SELECT 1"] + \
        [f"plproxy router {n} {w}" for n in (1, 2, 4) for w in ("take", "SELECT 1")]:
    direct = "plproxy direct take" if label.endswith("take") else "plproxy direct SELECT 1"
    lines.append(row(label, direct, "plproxy direct SELECT 1"))
for label in ["citus direct take", "citus direct SELECT 1", "citus delegated take", "citus delegated SELECT 1"]:
    direct = "citus direct take" if label.endswith("take") else "citus direct SELECT 1"
    lines.append(row(label, direct, "citus direct SELECT 1"))
for label in ["single routed-script take", "single+citus routed-script take", "citus routed take"]:
    lines.append(row(label, "single routed-script take", "citus direct SELECT 1"))
for label in ["single lookup", "single+citus lookup", "citus routed lookup"]:
    lines.append(row(label, "single lookup", "citus direct SELECT 1"))
def ratios(f, *labels):
    return [f(*(runs[label][i] for label in labels)) for i in range(len(runs[labels[0]]))]
def bound_ratios(path, floor, direct):
    return ratios(lambda p, f, d: p * (1 / f + 1 / d), path, floor, direct)
def cell(values):
    return f"{statistics.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})"
lines += [
    "",
    "Each round's ratios, and their median (a ratio of figures measured in the same round cancels the",
    "machine's drift between rounds). Against the additive bound 1 / (1/floor + 1/direct take), the floor",
    "being SELECT 1 through the same path (the hop alone) and the direct take the same call on one server",
    "(the work alone):",
    "",
    "| path | of its additive bound (median; each round) |",
    "| --- | --- |",
    f"| citus delegated take | {cell(bound_ratios('citus delegated take', 'citus delegated SELECT 1', 'citus direct take'))} |",
    f"| plproxy router 1 take | {cell(bound_ratios('plproxy router 1 take', 'plproxy router 1 SELECT 1', 'plproxy direct take'))} |",
] + ([
    f"| plproxy router 1 take, the forwarding functions of the baseline's router/plproxy.sql | {cell(bound_ratios('plproxy router 1 take, baseline forwarding', 'plproxy router 1 SELECT 1', 'plproxy direct take'))} |",
] if 'plproxy router 1 take, baseline forwarding' in runs else []) + [
    "",
    "| path | of the same script on one server (median; each round) |",
    "| --- | --- |",
    f"| citus routed take | {cell(ratios(lambda r, s: r / s, 'citus routed take', 'single routed-script take'))} |",
    f"| single+citus routed-script take (Citus loaded, nothing distributed) | {cell(ratios(lambda r, s: r / s, 'single+citus routed-script take', 'single routed-script take'))} |",
    f"| single+citus lookup (the script's first statement alone) | {cell(ratios(lambda r, s: r / s, 'single+citus lookup', 'single lookup'))} |",
    "",
    "| path | of the same script on a server with Citus loaded and nothing distributed (median; each round) |",
    "| --- | --- |",
    f"| citus routed take | {cell(ratios(lambda r, s: r / s, 'citus routed take', 'single+citus routed-script take'))} |",
    f"| citus routed lookup | {cell(ratios(lambda r, s: r / s, 'citus routed lookup', 'single+citus lookup'))} |",
    "",
    "`citus routed take`: the call sent straight to its key's node (worker 1, keys placed there by",
    "`rate_limit.nodes_of`), against the same script (a key read from a plain table, then the take) on the",
    "server without Citus (`single routed-script take`) and on a server with Citus loaded (`CREATE EXTENSION",
    "citus`) and nothing distributed (`single+citus`): the part of a routed call's cost that is Citus's hooks",
    "on every statement, whatever rate_limit does. `lookup`: the script's first statement alone.",
]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
