# Reservations and bookings against take, call by call, in both stores: on the server bench/run.sh sets up (release
# build, its own copy of PostgreSQL 15, 1 000 000 memory buckets, 100 000 keys), 100 000 random keys of
# policy `bench` (mostly granted). Writes bench/results/reservations.md.
#
#   bench/run.sh reservations                           (about 25 minutes with the release build: 12
#                                                        scenarios × 2 stores × BENCH_ROUNDS rounds of
#                                                        BENCH_SECONDS s)
#   BENCH_ROUNDS=5 BENCH_SECONDS=10 BENCH_CLIENTS=8 bench/run.sh reservations
#
# Scenarios, each a pgbench transaction: SELECT 1; one take; one reserve (held 1 second, so that the
# reservations left unsettled expire and their buckets are purged and vacuumed between scenarios: held for the default
# 5 minutes, 10 seconds of them fill the memory store's share of the database); a reserve and its settle
# (the id kept with \gset); two takes; a booking of policy `bench` (its tokens mostly there: booked for now,
# nothing recorded); a booking ahead (policy `bench_ahead`, 1 token a second, burst 1, max_debt 1: a
# booking of 2 tokens from a key's full bucket is for a second later, so it records its booking, held that
# second); a reserve and its settle by amounts of weighted meters (policy `bench` given meters
# {"input": 0.5, "output": 1}: 2 input units reserved, 1 used, 1 token each way); over two limits, a
# take_many of policies `bench` and `bench_b` (the same numbers), a reserve_many of them, and a
# reserve_many with its settle_many; a take on `bench_child` (bench's numbers, a child of `bench_b`: its
# call takes from both, as the take_many does). Every figure is a ratio within one round (rounds interleaved, so drift of
# this noisy machine cancels out). Goal (issue 43): each new call at least 0.85 of take. reserve and book are one
# call against one take; settle's time is the reserve-and-settle transaction's less the reserve's, against a
# take's (each from its scenario's TPS in the same round); and a reservation's whole round trip (reserve and
# settle) against two takes, the same two statements' shape; a reserve_many against a take_many of the same two
# policies (the call it replaces), and its settle_many as a settle is; a take on a child against that
# take_many (the same two buckets). pgbench -M prepared over Unix sockets,
# synchronous_commit = off (the table store measures the extension, not fsync).
SECONDS_PER_ROUND=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-5}
CLIENTS=${BENCH_CLIENTS:-8}
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out"
RAW="$OUT/reservations.tsv"
mkdir -p "$OUT"

BENCH_SETUP_ONLY=1 bench/run.sh every_call >"$OUT/reservations-setup.log"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
pg_bindir() { case $1 in bench) echo "$DIR/pg/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
trap 'cluster_stop bench "$DIR/data"' EXIT
psql_at bench "$PORT" -d bench -qAtc \
  "SELECT rate_limit.create_policy('bench_ahead', 1, '1 second', burst => 1, max_debt => 1)
   WHERE NOT EXISTS (SELECT FROM rate_limit.policies WHERE name = 'bench_ahead')" >/dev/null
psql_at bench "$PORT" -d bench -qAtc \
  "SELECT rate_limit.create_policy('bench_b', 2, '1 second', burst => 120)
   WHERE NOT EXISTS (SELECT FROM rate_limit.policies WHERE name = 'bench_b')" >/dev/null
# a child of bench_b with bench's numbers: a take on it takes from both, as take_many of bench and bench_b
psql_at bench "$PORT" -d bench -qAtc \
  "SELECT rate_limit.create_policy('bench_child', 2, '1 second', burst => 120, options => '{\"parent\": \"bench_b\"}')
   WHERE NOT EXISTS (SELECT FROM rate_limit.policies WHERE name = 'bench_child')" >/dev/null
# the weighted meters of the amounts scenario (no effect on a take)
psql_at bench "$PORT" -d bench -qAtc \
  "SELECT rate_limit.alter_policy('bench', options => '{\"meters\": {\"input\": 0.5, \"output\": 1}}')
   WHERE (SELECT meters IS NULL FROM rate_limit.policies WHERE name = 'bench')" >/dev/null

# scenario  pgbench script
SCENARIOS=(
  "select1 select1.sql"
  "take take_random.sql"
  "reserve reservations/reserve_random.sql"
  "reserve_settle reservations/reserve_settle_random.sql"
  "reserve_settle_amounts reservations/reserve_settle_amounts_random.sql"
  "take_take reservations/take_take_random.sql"
  "book reservations/book_random.sql"
  "book_ahead reservations/book_ahead_random.sql"
  "take_many reservations/take_many_random.sql"
  "take_child reservations/take_child_random.sql"
  "reserve_many reservations/reserve_many_random.sql"
  "reserve_settle_many reservations/reserve_settle_many_random.sql"
)
: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for store in table memory; do
    for s in "${SCENARIOS[@]}"; do
      read -r scenario script <<<"$s"
      tps=$(bench_round bench "$PORT" "$CLIENTS" "$scenario" "$store" "$script")
      printf '%s\t%s\t%s\t%s\n' "$round" "$store" "$scenario" "$tps" >>"$RAW"
      echo "round $round store=$store $scenario tps=$tps"
      # the reservations' buckets (held 1 second) deleted once expired and their dead rows vacuumed,
      # untimed, so that every scenario meets the same 100 000 keys' buckets and none the dead rows of the
      # one before
      case $scenario in reserve* | book_ahead)
        sleep 1.1
        psql_at bench "$PORT" -d bench -qAtc "SELECT rate_limit.purge()" >/dev/null
        psql_at bench "$PORT" -d bench -qAtc "VACUUM rate_limit.bucket_state" >/dev/null ;;
      esac
    done
  done
done

python3 - "$RAW" "$ROUNDS" "$SECONDS_PER_ROUND" "$CLIENTS" "$(git rev-parse --short HEAD)" \
  >bench/results/reservations.md <<'PY'
import statistics, sys, platform, os
raw, rounds, seconds, clients, head = sys.argv[1:6]
tps = {}
for line in open(raw):
    r, store, s, v = line.rstrip("\n").split("\t")
    tps[(int(r), store, s)] = float(v)
R = sorted({k[0] for k in tps})
def fmt(v):
    return f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"
print("# Reservations and bookings against take\n")
print(f"Command: `BENCH_ROUNDS={rounds} BENCH_SECONDS={seconds} BENCH_CLIENTS={clients} bench/run.sh reservations` "
      f"at {head}; {platform.machine()}, {os.cpu_count()} cores; PostgreSQL 15, release build, 100 000 random "
      f"keys of policy `bench` (2 per second, burst 120: mostly granted), pgbench -M prepared over Unix sockets, "
      f"{clients} clients, synchronous_commit = off; rounds interleaved. Figures: median over the rounds "
      "(lowest–highest round).\n")
print("| transaction | store | TPS ÷ SELECT 1 |")
print("| --- | --- | --- |")
labels = [("take", "`take('bench', key)`"),
          ("reserve", "`reserve('bench', key, 1)`"),
          ("reserve_settle", "`reserve('bench', key, 1)` then `settle('bench', key, id, 1)`"),
          ("reserve_settle_amounts", "the same by amounts of weighted meters"),
          ("take_take", "two `take('bench', key)`"),
          ("book", "`book('bench', key)` (for now)"),
          ("book_ahead", "`book('bench_ahead', key, 2)` (for a second later, recorded)"),
          ("take_many", "`take_many(ARRAY['bench', 'bench_b'], ARRAY[key])`"),
          ("take_child", "`take('bench_child', key)` (a child of `bench_b`: two buckets)"),
          ("reserve_many", "`reserve_many(ARRAY['bench', 'bench_b'], key, ARRAY[1])`"),
          ("reserve_settle_many", "`reserve_many(…)` then `settle_many(ARRAY['bench', 'bench_b'], key, id, ARRAY[1])`")]
for store in ("table", "memory"):
    for s, label in labels:
        print(f"| {label} | {store} | {fmt([tps[(r, store, s)] / tps[(r, store, 'select1')] for r in R])} |")
print("\n| goal: each new call ≥ 0.85 × take (same round) | store | measured | |")
print("| --- | --- | --- | --- |")
for store in ("table", "memory"):
    t = lambda r, s: 1.0 / tps[(r, store, s)]
    reserve = [t(r, "take") / t(r, "reserve") for r in R]
    settle = [t(r, "take") / max(t(r, "reserve_settle") - t(r, "reserve"), 1e-12) for r in R]
    pair = [tps[(r, store, "reserve_settle")] / tps[(r, store, "take_take")] for r in R]
    amounts = [tps[(r, store, "reserve_settle_amounts")] / tps[(r, store, "reserve_settle")] for r in R]
    amounts_pair = [tps[(r, store, "reserve_settle_amounts")] / tps[(r, store, "take_take")] for r in R]
    book = [t(r, "take") / t(r, "book") for r in R]
    ahead = [t(r, "take") / t(r, "book_ahead") for r in R]
    many = [t(r, "take_many") / t(r, "reserve_many") for r in R]
    many_settle = [t(r, "take_many") / max(t(r, "reserve_settle_many") - t(r, "reserve_many"), 1e-12) for r in R]
    child = [t(r, "take_many") / t(r, "take_child") for r in R]
    for name, v in [("reserve: a take's time ÷ a reserve's", reserve),
                    ("book (for now): a take's time ÷ a booking's", book),
                    ("book ahead: a take's time ÷ a booking's", ahead),
                    ("settle: a take's time ÷ (reserve and settle − reserve)", settle),
                    ("a reservation's round (reserve and settle) ÷ two takes", pair),
                    ("a round by amounts ÷ the same in tokens (the price of weighing)", amounts),
                    ("a round by amounts ÷ two takes", amounts_pair),
                    ("reserve_many: a take_many's time ÷ a reserve_many's (two policies)", many),
                    ("settle_many: a take_many's time ÷ (reserve_many and settle_many − reserve_many)", many_settle),
                    ("a take on a child: a take_many's time (the same two buckets) ÷ the child's take", child)]:
        m = statistics.median(v)
        print(f"| {name} | {store} | {fmt(v)} | {'met' if m >= 0.85 else 'NOT met'} |")
PY
cat bench/results/reservations.md
