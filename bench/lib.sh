# Shared by the benchmark suites (bench/run.sh sources it after scripts/cluster.sh, before the suite): the
# release build of a source tree in its own copy of PostgreSQL 15, the benchmark database every suite fills
# alike, and the scenarios.

# Every call measured, as "scenario store pgbench-script" (store "-": no extension call).
BENCH_SCENARIOS=(
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

# program_total FILE: the instructions a callgrind output file counts (its PROGRAM TOTALS).
program_total() {
  callgrind_annotate "$1" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}

# bench_install TREE SOURCE_DIR TARGET_DIR PG15: TREE = a copy of the tests' PostgreSQL 15 (at PG15) holding
# the release package of SOURCE_DIR, built in TARGET_DIR (never the tests' or the demo's installation: a
# running server whose library is replaced in place crashes).
bench_install() {
  local tree=$1 src=$2 target=$3 pg15=$4
  rm -rf "$tree" "$tree.pkg"
  cp -a "$pg15" "$tree"
  (cd "$src" && CARGO_TARGET_DIR="$target" cargo pgrx package --pg-config "$pg15/bin/pg_config" \
    --features pg15 --no-default-features --out-dir "$tree.pkg" >/dev/null)
  rm -f "$tree"/share/postgresql/extension/rate_limit*
  cp -a "$tree.pkg$pg15/." "$tree/"
  chmod -R a+rX "$tree"
}

# bench_install_revision TREE REVISION TARGET_DIR PG15: the same for a revision of this repository, built
# from a temporary worktree.
bench_install_revision() {
  local tree=$1 revision=$2 target=$3 pg15=$4
  rm -rf "$tree.src"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add --detach -f "$tree.src" "$revision" >/dev/null
  bench_install "$tree" "$tree.src" "$target" "$pg15"
  git -C "$ROOT" worktree remove --force "$tree.src"
}

# bench_start_two_builds BASELINE_REV: release builds of this tree (label "new") and of BASELINE_REV
# ("baseline"), each in its own copy of PostgreSQL 15 under $DIR, each with a preloaded server on
# ${PORT[label]}, both stopped when the script exits. Redefines pg_bindir so that the two labels name those
# installations (every other label keeps its meaning from scripts/cluster.sh).
bench_start_two_builds() {
  local baseline_rev=$1 pg15 b
  pg15=$(dirname "$(pg_bindir 15)")
  pg_bindir() { case $1 in new | baseline) echo "$DIR/$1/bin" ;; system) echo /usr/lib/postgresql/15/bin ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
  echo "== release builds of $(git -C "$ROOT" rev-parse --short HEAD) and $baseline_rev"
  for b in new baseline; do cluster_stop "$b" "$DIR/data-$b"; done
  bench_install "$DIR/new" "$ROOT" "$DIR/target-new" "$pg15"
  bench_install_revision "$DIR/baseline" "$baseline_rev" "$DIR/target-baseline" "$pg15"
  for b in new baseline; do
    rm -rf "$DIR/data-$b"
    cluster_start "$b" "$DIR/data-$b" "${PORT[$b]}" "max_connections = 100" \
      "shared_preload_libraries = 'rate_limit'" "rate_limit.max_buckets = 1000000"
  done
  trap 'cluster_stop new "$DIR/data-new"; cluster_stop baseline "$DIR/data-baseline"' EXIT
}

# bench_fill LABEL PORT: database `bench` with 100 000 keys in every namespace of both stores, and in the
# PL/pgSQL baseline's table. The policies of the kinds added after 0.3.0 (charges, calendars, leases,
# penalty boxes, blocks) are filled one feature at a time: a build without that feature (an A/B baseline)
# reports it and goes on, and the scenarios that need it are skipped for that build (bench_round).
bench_fill() {
  local label=$1 port=$2
  rm -f "$DIR/lacks-$label"
  psql_at "$label" "$port" -d postgres -qc "CREATE DATABASE bench"
  psql_at "$label" "$port" -d bench -q -c "CREATE EXTENSION rate_limit" -f "$ROOT/bench/setup/baseline.sql" \
    -c "SELECT rate_limit.create_policy('bench', 2, '1 second', 120)" \
    -c "SELECT rate_limit.create_policy('bench_b', 20, '1 second', 1200)" \
    -c "SELECT rate_limit.create_policy('bench_c', 200, '1 second', 12000)" \
    -c "SELECT count(baseline_rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
    -c "SELECT baseline_rate_limiting_request('hot', 2, 60)" # the baseline raises unique_violation when two
  #                                                             sessions create one key: create it beforehand
  bench_fill_feature "$label" "$port" charge 100000 \
    -c "SELECT rate_limit.create_policy('bench_charge', 2, '1 second', 120, store => 'memory', max_debt => 1000)" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.charge('bench_charge', 'key' || g, 1) d"
  bench_fill_feature "$label" "$port" calendar 100000 \
    -c "SELECT rate_limit.create_policy('bench_month', 120, '1 month', algorithm => 'calendar_window',
          time_zone => 'Europe/Paris', store => 'memory')" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench_month', 'key' || g) d"
  bench_fill_feature "$label" "$port" acquire 100000 \
    -c "SELECT rate_limit.create_policy('bench_jobs', 4, '1 second', algorithm => 'concurrency', store => 'memory')" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.acquire('bench_jobs', 'key' || g) d"
  bench_fill_feature "$label" "$port" penalty 100000 \
    -c "SELECT rate_limit.create_policy('bench_box', 2, '1 second', 120, store => 'memory',
          block_after => 2147483647, block_for => '1 second')" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limit.take('bench_box', 'key' || g) d"
  bench_fill_feature "$label" "$port" blocked 10001 \
    -c "SELECT rate_limit.create_policy('bench_blocked', 2, '1 second', 120, store => 'memory')" \
    -c "SELECT count(*) FROM generate_series(1, 10000) g,
          LATERAL rate_limit.block('bench_blocked', 'key' || g, '36500 days') d" \
    -c "SELECT rate_limit.block('bench_blocked', 'hot', '36500 days')"
  for store in table memory; do
    psql_at "$label" "$port" -d bench -q -c "SET rate_limit.store = '$store'" \
      -c "SELECT count(rate_limiting_request('key' || g, 2, 60)) FROM generate_series(1, 100000) g" \
      -c "SELECT count(*) FROM generate_series(1, 100000) g,
            LATERAL rate_limit.take_many(ARRAY['bench', 'bench_b', 'bench_c'], ARRAY['key' || g]) d"
  done
  psql_at "$label" "$port" -d bench -qc "VACUUM ANALYZE"
}

# bench_fill_feature LABEL PORT FEATURE BUCKETS PSQL-ARGS...: one feature's policy and keys (BUCKETS memory
# buckets), in one transaction. A build that lacks the feature is recorded in $DIR/lacks-LABEL and gets
# BUCKETS buckets of a plain policy instead: both builds' memory stores then hold as many buckets, and a
# lookup costs the same (the fuller a store's table, the longer its probes).
bench_fill_feature() {
  local label=$1 port=$2 feature=$3 buckets=$4
  shift 4
  if ! psql_at "$label" "$port" -d bench -q -1 "$@" >/dev/null 2>"$DIR/fill-$label-$feature.err"; then
    echo "$label lacks $feature ($(head -1 "$DIR/fill-$label-$feature.err")): $buckets plain buckets instead"
    echo "$feature" >>"$DIR/lacks-$label"
    psql_at "$label" "$port" -d bench -q \
      -c "SELECT rate_limit.create_policy('bench_filler_$feature', 2, '1 second', 120, store => 'memory')" \
      -c "SELECT count(*) FROM generate_series(1, $buckets) g,
            LATERAL rate_limit.take('bench_filler_$feature', 'key' || g) d" >/dev/null
  fi
}

# bench_lacks LABEL SCENARIO: true when LABEL's build lacks the feature SCENARIO needs (bench_fill_feature).
bench_lacks() {
  local label=$1 scenario=$2
  [ -f "$DIR/lacks-$label" ] && grep -qx "${scenario%%_*}" "$DIR/lacks-$label"
}

# bench_round LABEL PORT CLIENTS SCENARIO STORE SCRIPT: one pgbench round; prints its TPS.
bench_round() {
  local label=$1 port=$2 clients=$3 scenario=$4 store=$5 script=$6 out tps
  out=$(PGOPTIONS="-c synchronous_commit=off -c rate_limit.store=${store/-/table}" \
    "$(pg_bindir "$label")/pgbench" -n -M prepared -h "$RATE_LIMIT_SOCKET_DIR" -p "$port" -U postgres \
    -c "$clients" -j 2 -T "$SECONDS_PER_ROUND" -f "$ROOT/bench/scenarios/$script" bench 2>&1) ||
    { echo "$out" >&2; echo "pgbench failed: $scenario" >&2; return 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
  echo "${tps:-0}"
}
