# What rate_limit.allow costs a server's CPU in an application's primary-key lookup, the kernel's work for
# the backend included: the lookup transaction as a client sends it (pgbench -M prepared, one client,
# BENCH_TRANSACTIONS transactions) with allow in its WHERE (the key as a parameter), without it, and with
# the floor of that place (textne('bench', :k), a built-in function that does nothing). What a backend
# spent is read from the postmaster's count of its exited children's CPU time (/proc, user and system),
# before and after each pgbench run: the client's backend and pgbench's first, empty, connection (a few
# milliseconds against seconds), autovacuum off meanwhile. The client's own CPU is not counted: on a real
# deployment it runs elsewhere, and a server's throughput is its CPU over what each transaction costs it.
# The kinds alternate, BENCH_ROUNDS rounds; every bucket exists before. Writes
# bench/results/allow_server_cpu.md.
#
#   bench/run.sh allow_server_cpu          (about 5 minutes after the build)
TRANSACTIONS=${BENCH_TRANSACTIONS:-100000}
ROUNDS=${BENCH_ROUNDS:-7}
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out"
RAW="$OUT/allow_server_cpu.tsv"
mkdir -p "$OUT"

BENCH_SETUP_ONLY=1 bench/run.sh every_call >"$OUT/allow_server_cpu-setup.log"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
pg_bindir() { case $1 in bench) echo "$DIR/pg/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
autovacuum() { # autovacuum on|off: the bench server's setting, reloaded
  psql_at bench "$PORT" -d postgres -qAt -c "ALTER SYSTEM SET autovacuum = $1" -c "SELECT pg_reload_conf()" >/dev/null
}
trap 'autovacuum on; cluster_stop bench "$DIR/data"' EXIT
psql_at bench "$PORT" -d bench -q -f bench/setup/allow_lookup.sql
PGOPTIONS="-c rate_limit.store=memory" psql_at bench "$PORT" -d bench -Atc \
  "SELECT count(*) FROM bench_docs WHERE rate_limit.allow('bench', id::text)" >/dev/null
autovacuum off

POSTMASTER=$(head -1 "$DIR/data/postmaster.pid")
TICKS=$(getconf CLK_TCK)
children_cpu() { # children_cpu: "user system" clock ticks of the postmaster's exited children so far
  sed 's/.*) //' "/proc/$POSTMASTER/stat" | awk '{print $14, $15}'
}

: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for kind in lookup lookup_allow_key lookup_floor; do
    read -r user0 system0 < <(children_cpu)
    PGOPTIONS="-c rate_limit.store=memory" "$(pg_bindir bench)/pgbench" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" \
      -p "$PORT" -U postgres -c 1 -t "$TRANSACTIONS" -f "bench/scenarios/allow/$kind.sql" bench >"$OUT/allow_server_cpu-pgbench.log" 2>&1 ||
      { cat "$OUT/allow_server_cpu-pgbench.log" >&2; exit 1; }
    sleep 1 # the backend exits and is reaped after pgbench returns
    read -r user1 system1 < <(children_cpu)
    printf '%s\t%s\t%s\t%s\n' "$round" "$kind" "$((user1 - user0))" "$((system1 - system0))" >>"$RAW"
    echo "round $round $kind user=$((user1 - user0)) system=$((system1 - system0)) ticks"
  done
done

python3 - "$RAW" "$TICKS" "$TRANSACTIONS" "$ROUNDS" "$(git rev-parse --short HEAD)" >"$ROOT/bench/results/allow_server_cpu.md" <<'PY'
import statistics, sys
raw, ticks, n, rounds, head = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
us = {}  # (round, kind) -> (user µs, system µs) per transaction
for line in open(raw):
    r, kind, user, system = line.split("\t")
    us[(r, kind)] = (int(user) * 1e6 / ticks / n, int(system) * 1e6 / ticks / n)
rs = sorted({r for r, _ in us}, key=int)
def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"
def per_tx(kind, part):
    return [us[(r, kind)][part] if part < 2 else sum(us[(r, kind)]) for r in rs]
def added(kind):  # within each round: what kind adds to the lookup, as a share of the transaction with it
    return [(sum(us[(r, kind)]) - sum(us[(r, "lookup")])) / sum(us[(r, kind)]) * 100 for r in rs]
names = {
    "lookup": "the lookup `SELECT body FROM bench_docs WHERE id = :k`",
    "lookup_allow_key": "+ `rate_limit.allow('bench', :k)` in its WHERE",
    "lookup_floor": "the floor: + `textne('bench', :k)` in its WHERE",
}
print("# What allow costs a server's CPU in a lookup, the kernel's work included\n")
print(f"Command: `bench/run.sh allow_server_cpu` at {head}; PostgreSQL 15, release build, memory store, policy")
print(f"'bench' (buckets existing); pgbench -M prepared, one client, {n:,} transactions per kind and round,")
print(f"{rounds} rounds, the kinds alternating; the backend's CPU from the postmaster's exited children's times")
print("(/proc), per transaction committed. Median over the rounds (lowest–highest).\n")
print("| transaction | user µs | system µs | server CPU µs per transaction | added, share of the transaction with it |")
print("| --- | --- | --- | --- | --- |")
f2 = lambda v: f"{v:.2f}"
for kind in ("lookup", "lookup_allow_key", "lookup_floor"):
    share = "" if kind == "lookup" else spread(added(kind), lambda v: f"{v:.1f}%")
    print(f"| {names[kind]} | {spread(per_tx(kind, 0), f2)} | {spread(per_tx(kind, 1), f2)} | "
          f"{spread(per_tx(kind, 2), f2)} | {share} |")
PY
cat "$ROOT/bench/results/allow_server_cpu.md"
