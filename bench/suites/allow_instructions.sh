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
#   bench/run.sh allow_instructions          (about 5 minutes after the build)
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
  program_total "$file"
}
per_lookup() { # per_lookup KIND: instructions of one lookup of KIND
  echo $((($(instructions "$1" 4000) - $(instructions "$1" 2000)) / 2000))
}

declare -A COUNT
for kind in lookup lookup_allow lookup_take_from; do COUNT[$kind]=$(per_lookup "$kind"); done
echo "ALTER FUNCTION rate_limit.allow(text, text, integer) SECURITY DEFINER" | single_user
COUNT[lookup_allow_definer]=$(per_lookup lookup_allow)
echo "ALTER FUNCTION rate_limit.allow(text, text, integer) SECURITY INVOKER" | single_user

# The same lookup as a client sends it: a pgbench transaction (-M prepared, one client, the scripts of
# bench/scenarios/allow) against the postmaster of the same data directory under callgrind, counting the
# backend's instructions per transaction (3 000 minus 1 000 transactions, over 2 000): the protocol, the
# prepared statement's execution and the commit included, the kernel's and the client's work not. Kinds:
# the bare lookup; allow in its WHERE with the key built there ('key' || :k, as bench/run.sh allow times
# it) and with the key passed as a parameter (as an application passes its user's id); and the floor of
# that place, a built-in function of two text arguments (textne('bench', :k)) instead of allow: what any
# function called there costs the statement before its own work. Every bucket exists before (all 100 000
# keys of both forms taken once).
CG="$OUT/server"
mkdir -p "$CG" && chmod 777 "$CG"
su postgres -c "nohup valgrind --tool=callgrind --callgrind-out-file=$CG/backend.%p $DIR/pg/bin/postgres -D $DIR/data -c autovacuum=off >$CG/server.log 2>&1 &"
trap 'cluster_stop bench "$DIR/data"' EXIT
for _ in $(seq 1 120); do "$DIR/pg/bin/pg_isready" -q -h "$RATE_LIMIT_SOCKET_DIR" -p "$PORT" && break; sleep 1; done
PGOPTIONS="-c rate_limit.store=memory" psql_at bench "$PORT" -d bench -Atc \
  "SELECT count(*) FROM bench_docs WHERE rate_limit.allow('bench', 'key' || id) AND rate_limit.allow('bench', id::text)" >/dev/null
sleep 3 # that backend's counts written before the first transaction's listing
backend_instructions() { # backend_instructions SCRIPT N: the instructions of the backend that ran N transactions
  local before file total best=0
  before=$(cd "$CG" && ls backend.* | sort)
  PGOPTIONS="-c rate_limit.store=memory" "$DIR/pg/bin/pgbench" -n -M prepared --random-seed=7 -h "$RATE_LIMIT_SOCKET_DIR" \
    -p "$PORT" -U postgres -c 1 -t "$2" -f "bench/scenarios/$1" bench >>"$CG/pgbench.log" 2>&1
  sleep 3 # the backend writes its counts as it exits
  for file in $(comm -13 <(echo "$before") <(cd "$CG" && ls backend.* | sort)); do
    grep -q PostgresMain "$CG/$file" || continue # a client's backend, not a background process
    total=$(program_total "$CG/$file")
    [ "${total:-0}" -le "$best" ] || best=$total
  done
  echo "$best"
}
declare -A TX
for kind in select1 allow/lookup allow/lookup_allow allow/lookup_allow_key allow/lookup_floor; do
  TX[$kind]=$((($(backend_instructions "$kind.sql" 3000) - $(backend_instructions "$kind.sql" 1000)) / 2000))
done
cluster_stop bench "$DIR/data"
tx_added() { echo $((TX[$1] - TX[allow/lookup])); }
tx_lost() { python3 -c "print(f'{100 * $(tx_added "$1") / ${TX[$1]}:.1f}%')"; }

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
  echo
  echo "The lookup transaction as a client sends it (pgbench -M prepared, one client, against the postmaster"
  echo "under callgrind): the backend's instructions per transaction, and the throughput the addition would"
  echo "cost a server whose time went to these instructions alone (added ÷ the transaction with it):"
  echo
  echo "| transaction | instructions | added to the lookup | throughput lost |"
  echo "| --- | --- | --- | --- |"
  echo "| \`SELECT 1\` | ${TX[select1]} | | |"
  echo "| the lookup | ${TX[allow/lookup]} | | |"
  echo "| with \`rate_limit.allow('bench', 'key' \|\| :k)\` in its WHERE | ${TX[allow/lookup_allow]} | $(tx_added allow/lookup_allow) | $(tx_lost allow/lookup_allow) |"
  echo "| with \`rate_limit.allow('bench', :k)\` in its WHERE | ${TX[allow/lookup_allow_key]} | $(tx_added allow/lookup_allow_key) | $(tx_lost allow/lookup_allow_key) |"
  echo "| the floor: \`textne('bench', :k)\` in its WHERE | ${TX[allow/lookup_floor]} | $(tx_added allow/lookup_floor) | $(tx_lost allow/lookup_floor) |"
} >bench/results/allow_instructions.md
cat bench/results/allow_instructions.md
