# At the floor of a SQL round trip: every call as a ratio to `SELECT 1` measured in the same run, 8 and 32
# clients, a hot key (mostly denied) and 100 000 random keys (mostly granted), both stores, against the
# PL/pgSQL baseline (bench/setup/baseline.sql) for table-store grants. Writes bench/results/every_call.md and the chart
# bench/results/every_call.svg (gnuplot), from bench/out/raw.tsv (one line per pgbench round).
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
bench_install "$DIR/pg" "$ROOT" "$DIR/target" "$PG15"

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
bench_fill bench "$PORT"
psql_at bench "$PORT" -d bench -AtF $'\t' -c "SELECT max_buckets, slot_bytes, total_bytes, bytes_per_bucket
  FROM rate_limit.memory_usage()" >"$OUT/memory_usage.tsv"
if [ -n "${BENCH_SETUP_ONLY:-}" ]; then
  echo "server left running: $(pg_bindir bench)/psql -h $RATE_LIMIT_SOCKET_DIR -p $PORT -U postgres bench"
  echo "stop it with: su postgres -c '$(pg_bindir bench)/pg_ctl -D $DIR/data stop'"
  exit 0
fi

: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for clients in 8 32; do
    for s in "${BENCH_SCENARIOS[@]}"; do
      read -r scenario store script <<<"$s"
      tps=$(bench_round bench "$PORT" "$clients" "$scenario" "$store" "$script")
      printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$clients" "$scenario" "$store" "$tps" >>"$RAW"
      echo "round $round clients $clients $scenario store=$store tps=$tps"
    done
  done
done

python3 bench/setup/report.py "$RAW" "$OUT/memory_usage.tsv" \
  "${BENCH_HUGE_PAGES:+BENCH_HUGE_PAGES=1 }BENCH_ROUNDS=$ROUNDS BENCH_SECONDS=$SECONDS_PER_ROUND bench/run.sh" \
  "$(git rev-parse --short HEAD)" "$OUT" "$PAGES" >bench/results/every_call.md
gnuplot "$OUT/chart.gp"
cat bench/results/every_call.md
