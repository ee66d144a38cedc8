# What rate_limit.allow and take add to an application's primary-key lookup, counted in instructions
# (callgrind) instead of timed: exact and repeatable where this machine's timings move by a factor of two
# from one round to the next. The loop is bench/setup/allow_lookup.sql's bench_lookup_us, run by a role
# with a login and nothing else, in a single-user server of the release build bench/run.sh sets up
# (memory store, policy 'bench', 2 per second, burst 120), under valgrind. Each kind runs twice, 2 000 and
# 4 000 lookups after the same warm-up (4 000 calls of allow, which create the buckets), and the
# difference over the 2 000 more lookups is what one lookup costs, free of the server's start and stop.
# Also counted: allow declared SECURITY DEFINER again (ALTER FUNCTION), the declaration it had until it
# switched to its owner itself. Writes bench/results/allow_instructions.md.
#
#   bench/run.sh allow_instructions          (about 3 minutes after the build)
#
# In a single-user server every call also asks whether Citus is loaded (two GetConfigOption lookups, about
# 1 100 instructions: a backend under the postmaster asks once), counted here in the limit's share.
PORT=${RATE_LIMIT_BENCH_PORT:-5441}
DIR=${RATE_LIMIT_BENCH_DIR:-/var/tmp/rate_limit-bench}
OUT="$ROOT/bench/out/allow_instructions"
rm -rf "$OUT" && mkdir -p "$OUT" && chmod 777 "$OUT"
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null

BENCH_SETUP_ONLY=1 bench/run.sh every_call >"$OUT/setup.log"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
pg_bindir() { case $1 in bench) echo "$DIR/pg/bin" ;; *) echo "$PG_CACHE/$1/bin" ;; esac; }
psql_at bench "$PORT" -d bench -q -f bench/setup/allow_lookup.sql
cluster_stop bench "$DIR/data"

single_user() { # single_user [VALGRIND ARGS...] < SQL: a single-user server of the bench's data directory
  su postgres -c "$* $DIR/pg/bin/postgres --single -D $DIR/data bench" >>"$OUT/single.log" 2>&1
}
instructions() { # instructions KIND N: the instructions of the warm-up and N lookups of KIND
  local file="$OUT/$1-$2.callgrind"
  printf "SET rate_limit.store = memory\nSET ROLE bench_app\nSELECT bench_lookup_us('lookup_allow', 4000)\nSELECT bench_lookup_us('%s', %s)\n" "$1" "$2" |
    single_user valgrind --tool=callgrind --callgrind-out-file="$file"
  callgrind_annotate "$file" | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}
per_lookup() { # per_lookup KIND: instructions of one lookup of KIND
  echo $((($(instructions "$1" 4000) - $(instructions "$1" 2000)) / 2000))
}

declare -A COUNT
for kind in lookup lookup_allow lookup_take_from; do COUNT[$kind]=$(per_lookup "$kind"); done
echo "ALTER FUNCTION rate_limit.allow(text, text, integer) SECURITY DEFINER" | single_user
COUNT[lookup_allow_definer]=$(per_lookup lookup_allow)
echo "ALTER FUNCTION rate_limit.allow(text, text, integer) SECURITY INVOKER" | single_user

added() { echo $((COUNT[$1] - COUNT[lookup])); }
share() { python3 -c "print(f'{100 * $(added "$1") / ${COUNT[lookup]}:.1f}%')"; }
{
  echo "# What the limit adds to a lookup, in instructions"
  echo
  echo "Command: \`bench/run.sh allow_instructions\` at $(git rev-parse --short HEAD); PostgreSQL 15, release build,"
  echo "memory store, policy 'bench' (2 per second, burst 120, buckets existing), a single-user server under"
  echo "callgrind, the loop of bench/setup/allow_lookup.sql run by a role without rights; instructions of one"
  echo "lookup: the difference between 4 000 and 2 000 lookups, over 2 000."
  echo
  echo "| statement | instructions per lookup | added by the limit | as a share of the lookup |"
  echo "| --- | --- | --- | --- |"
  echo "| the lookup | ${COUNT[lookup]} | | |"
  echo "| with \`rate_limit.allow\` in its WHERE | ${COUNT[lookup_allow]} | $(added lookup_allow) | $(share lookup_allow) |"
  echo "| the same, allow declared SECURITY DEFINER | ${COUNT[lookup_allow_definer]} | $(added lookup_allow_definer) | $(share lookup_allow_definer) |"
  echo "| with \`rate_limit.take\` in its FROM | ${COUNT[lookup_take_from]} | $(added lookup_take_from) | $(share lookup_take_from) |"
  echo
  echo "In a single-user server each call also asks twice whether Citus is loaded (about 1 100 instructions that"
  echo "a backend under the postmaster spends once), included above in what the limit adds."
} >bench/results/allow_instructions.md
cat bench/results/allow_instructions.md
