#!/usr/bin/env bash
# At the floor of a SQL round trip: every call as a ratio to `SELECT 1` measured in the same run, 8 and 32
# clients, a hot key (mostly denied) and 100 000 random keys (mostly granted), both stores, against the
# PL/pgSQL baseline (bench/baseline.sql) for table-store grants. Writes bench/RESULTS.md and the chart
# bench/results.svg (gnuplot), from bench/out/raw.tsv (one line per pgbench round).
#
#   bench/run.sh                                  (about 30 minutes: a release build, then 25 scenarios × 2
#                                                  client counts × BENCH_ROUNDS rounds of BENCH_SECONDS s)
#   BENCH_ROUNDS=5 BENCH_SECONDS=5 bench/run.sh
#   BENCH_HUGE_PAGES=1 bench/run.sh               the server's shared memory on huge pages (as root: sets
#                                                  vm.nr_hugepages to what the server needs if it is lower)
#   BENCH_SETUP_ONLY=1 bench/run.sh               build, start and fill the server, leave it running (for
#                                                  perf); stop it with the command it prints
#
# The release build is installed into its own copy of the tests' PostgreSQL 15 (never the tests' or the
# demo's installation, whose running servers would crash if their library were replaced in place). The
# server preloads rate_limit with rate_limit.max_buckets = 1000000; pgbench -M prepared over Unix sockets,
# synchronous_commit = off (the table store measures the extension, not fsync). Rounds are interleaved:
# each round runs every scenario once, and each scenario's ratio in a round uses that round's `SELECT 1`, so
# drift of this noisy machine cancels out of the ratios. Reported: the median ratio over the rounds and the
# lowest and highest round.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
scripts/install-deps.sh
command -v gnuplot >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >/dev/null
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh

SECONDS_PER_ROUND=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out"
RAW="$OUT/raw.tsv"
mkdir -p "$OUT" "$DIR"

PG15=$(dirname "$(pg_bindir 15)")
pg_bindir() { case $1 in bench) echo "$DIR/pg/bin" ;; system) echo /usr/lib/postgresql/15/bin ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }

echo "== release build of $(git rev-parse --short HEAD) into a copy of PostgreSQL 15 ($DIR/pg)"
cluster_stop bench "$DIR/data"
rm -rf "$DIR/pg" "$DIR/pkg"
cp -a "$PG15" "$DIR/pg"
CARGO_TARGET_DIR="$DIR/target" cargo pgrx package --pg-config "$PG15/bin/pg_config" \
  --features pg15 --no-default-features --out-dir "$DIR/pkg" >/dev/null
rm -f "$DIR/pg"/share/postgresql/extension/rate_limit*
cp -a "$DIR/pkg$PG15/." "$DIR/pg/"
chmod -R a+rX "$DIR/pg"

rm -rf "$DIR/data"
cluster_start bench "$DIR/data" "$PORT" "max_connections = 100" \
  "shared_preload_libraries = 'rate_limit'" "rate_limit.max_buckets = 1000000"
[ -n "${BENCH_SETUP_ONLY:-}" ] || trap 'cluster_stop bench "$DIR/data"' EXIT
PAGES="4 kB pages"
if [ -n "${BENCH_HUGE_PAGES:-}" ]; then # shared memory on huge pages (reserves them with sysctl: root)
  cluster_stop bench "$DIR/data"
  need=$(as_pg "'$(pg_bindir bench)/postgres' -D '$DIR/data' -C shared_memory_size_in_huge_pages")
  [ "$(cat /proc/sys/vm/nr_hugepages)" -ge "$need" ] || sysctl -qw vm.nr_hugepages=$((need + 8))
  echo "huge_pages = on" | as_pg "cat >> '$DIR/data/postgresql.conf'"
  cluster_start bench "$DIR/data" "$PORT"
  PAGES="huge pages (huge_pages = on, $need pages of $(awk '/Hugepagesize/ {print $2 / 1024}' /proc/meminfo) MB)"
fi

echo "== 100 000 keys in every namespace of both stores, and in the baseline's table"
psql_at bench "$PORT" -d postgres -qc "CREATE DATABASE bench"
psql_at bench "$PORT" -d bench -q -c "CREATE EXTENSION rate_limit" -f bench/baseline.sql \
  -c "SELECT rate_limit.create_policy('bench', 2, '1 second', 120)" \
  -c "SELECT rate_limit.create_policy('bench_b', 20, '1 second', 1200)" \
  -c "SELECT rate_limit.create_policy('bench_c', 200, '1 second', 12000)" \
  -c "SELECT rate_limit.create_policy('bench_charge', 2, '1 second', 120, store => 'memory', max_debt => 1000)" \
  -c "SELECT rate_limit.create_policy('bench_month', 120, '1 month', algorithm => 'calendar_window',
        time_zone => 'Europe/Paris', store => 'memory')" \
  -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.charge('bench_charge', 'key' || g, 1) d" \
  -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench_month', 'key' || g) d" \
  -c "SELECT rate_limit.create_policy('bench_jobs', 4, '1 second', algorithm => 'concurrency', store => 'memory')" \
  -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.acquire('bench_jobs', 'key' || g) d" \
  -c "SELECT rate_limit.create_policy('bench_box', 2, '1 second', 120, store => 'memory',
        block_after => 2147483647, block_for => '1 second')" \
  -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench_box', 'key' || g) d" \
  -c "SELECT rate_limit.create_policy('bench_blocked', 2, '1 second', 120, store => 'memory')" \
  -c "SELECT count(*) FROM generate_series(1, 10000) g,
        LATERAL rate_limit.block('bench_blocked', 'key' || g, '36500 days') d" \
  -c "SELECT rate_limit.block('bench_blocked', 'hot', '36500 days')" \
  -c "SELECT count(baseline_rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
  -c "SELECT baseline_rate_limiting_request('hot', 2, 60)"  # the baseline raises unique_violation when two
  #                                                           sessions create one key: create it beforehand
for store in table memory; do
  psql_at bench "$PORT" -d bench -q -c "SET rate_limit.store = '$store'" \
    -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g,
          LATERAL rate_limit.take_many(ARRAY['bench', 'bench_b', 'bench_c'], ARRAY['key' || g]) d"
done
psql_at bench "$PORT" -d bench -qc "VACUUM ANALYZE"
psql_at bench "$PORT" -d bench -AtF $'\t' -c "SELECT max_buckets, slot_bytes, total_bytes, bytes_per_bucket
  FROM rate_limit.memory_usage()" >"$OUT/memory_usage.tsv"
if [ -n "${BENCH_SETUP_ONLY:-}" ]; then
  echo "server left running: $(pg_bindir bench)/psql -h $RATE_LIMIT_SOCKET_DIR -p $PORT -U postgres bench"
  echo "stop it with: su postgres -c '$(pg_bindir bench)/pg_ctl -D $DIR/data stop'"
  exit 0
fi

# scenario  store  pgbench script
SCENARIOS=(
  "select1 - select1.sql"
  "request_hot memory extension_hot.sql"
  "request_random memory extension_random.sql"
  "take_hot memory take_hot.sql"
  "take_random memory take_random.sql"
  "multi3_random memory multi3_random.sql"
  "request_hot table extension_hot.sql"
  "request_random table extension_random.sql"
  "take_hot table take_hot.sql"
  "take_random table take_random.sql"
  "multi3_random table multi3_random.sql"
  "baseline_hot table baseline_hot.sql"
  "baseline_random table baseline_random.sql"
  "take_select_random memory take_select_random.sql"
  "charge_hot memory charge_hot.sql"
  "charge_random memory charge_random.sql"
  "calendar_hot memory calendar_hot.sql"
  "calendar_random memory calendar_random.sql"
  "acquire_hot memory acquire_hot.sql"
  "acquire_random memory acquire_random.sql"
  "acquire_release_random memory acquire_release_random.sql"
  "penalty_hot memory penalty_hot.sql"
  "penalty_random memory penalty_random.sql"
  "blocked_hot memory blocked_hot.sql"
  "blocked_random memory blocked_random.sql"
)
PGBENCH="$(pg_bindir bench)/pgbench"
: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for clients in 8 32; do
    for s in "${SCENARIOS[@]}"; do
      read -r scenario store script <<<"$s"
      out=$(PGOPTIONS="-c synchronous_commit=off -c rate_limit.store=${store/-/table}" \
        "$PGBENCH" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" -U postgres \
        -c "$clients" -j 2 -T "$SECONDS_PER_ROUND" -f "bench/$script" bench 2>&1) ||
        { echo "$out" >&2; echo "pgbench failed" >&2; exit 1; }
      tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
      printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$clients" "$scenario" "$store" "${tps:-0}" >>"$RAW"
      echo "round $round clients $clients $scenario store=$store tps=${tps:-?}"
    done
  done
done

python3 bench/report.py "$RAW" "$OUT/memory_usage.tsv" \
  "${BENCH_HUGE_PAGES:+BENCH_HUGE_PAGES=1 }BENCH_ROUNDS=$ROUNDS BENCH_SECONDS=$SECONDS_PER_ROUND bench/run.sh" \
  "$(git rev-parse --short HEAD)" "$OUT" "$PAGES" >bench/RESULTS.md
gnuplot "$OUT/chart.gp"
cat bench/RESULTS.md
