#!/usr/bin/env bash
# The portable edition on a server without rate_limit's library, as a managed service runs it:
#   scripts/portable-test.sh VERSION
# 1. a copy of the tests' PostgreSQL VERSION without rate_limit's files (hard links: no disk, and the
#    copy has no file `cargo pgrx install` rewrites), plus the portable edition's control file and script;
#    a cluster of it with pg_tle preloaded (the way RDS, Aurora and Supabase install SQL extensions);
# 2. installed three ways, each by a role without superuser, each running the seed example:
#    psql -f by the database's owner; pgtle.install_extension then CREATE EXTENSION by a member of
#    pgtle_admin; CREATE EXTENSION rate_limit_portable (the control file, no library) by the database's owner;
# 3. the pg_regress examples of the features it has (REGRESS_PORTABLE), with the compiled edition's
#    expected output;
# 4. the integration tests of those features, parametrised by edition (RATE_LIMIT_TEST_EDITION=portable),
#    against this cluster, and the clock-step tests against the faketime cluster of scripts/test.sh.
# The faketime cluster must be running, named by RATE_LIMIT_TEST_FAKETIME_CONNINFO, _FILE, _STOP and _START
# (scripts/test.sh starts it and passes them, as to the compiled edition's integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
v=$1
# shellcheck source=cluster.sh
source scripts/cluster.sh
TEST_ROOT=${RATE_LIMIT_TEST_DIR:-/var/tmp/rate_limit-test}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
port=$((6100 + v))
copy="$TEST_ROOT/portable-pg/$v"
dir="$TEST_ROOT/portable-$v"

# 1. the installation without the library, and its cluster
cluster_stop "$v" "$dir"
rm -rf "$copy" "$dir"
mkdir -p "$(dirname "$copy")"
cp -al "$PG_CACHE/$v" "$copy"
pkglib=$("$copy/bin/pg_config" --pkglibdir)
share="$("$copy/bin/pg_config" --sharedir)/extension"
case $pkglib in "$copy"/*) ;; *) echo "the copy's pg_config names $pkglib, not a directory of $copy" >&2; exit 1 ;; esac
rm -f "$pkglib"/rate_limit*.so "$share"/rate_limit*
[ ! -e "$pkglib/rate_limit.so" ] && ! ls "$share"/rate_limit--* >/dev/null 2>&1
PG_CACHE="$TEST_ROOT/portable-pg" cluster_start "$v" "$dir" "$port" "fsync = off" "shared_preload_libraries = 'pg_tle'"
stop() { PG_CACHE="$TEST_ROOT/portable-pg" cluster_stop "$v" "$dir"; }
trap stop EXIT
psql_p() { PG_CACHE="$TEST_ROOT/portable-pg" psql_at "$v" "$port" "$@"; }

# the library is nowhere: not loadable, not an available extension
if psql_p -d postgres -qAtc "LOAD 'rate_limit'" 2>/dev/null; then
  echo "rate_limit's library loads on the portable edition's server" >&2; exit 1
fi
[ "$(psql_p -d postgres -qAtc "SELECT count(*) FROM pg_available_extensions WHERE name = 'rate_limit'")" = 0 ]

# 2. three ways in, by roles without superuser
seed() { # seed DATABASE ROLE: the seed example's first twelve calls, as ROLE
  psql_p -d "$1" -U "$2" -qAtc "SELECT string_agg(rate_limiting_request('seed', 1, 10)::text, ' ' ORDER BY n)
                                FROM generate_series(1, 12) AS n"
}
expect_seed() { # expect_seed HOW DATABASE ROLE
  local got
  got=$(seed "$2" "$3")
  if [ "$got" != "9 8 7 6 5 4 3 2 1 0 -1 -1" ]; then
    echo "$1: the seed example printed: $got" >&2; return 1
  fi
  [ "$(psql_p -d "$2" -qAtc "SELECT rolsuper FROM pg_roles WHERE rolname = '$3'")" = f ]
  echo "$1: installed by $3 (not a superuser); the seed example prints 9 8 7 6 5 4 3 2 1 0 -1 -1"
}
psql_p -d postgres -q <<SQL
DROP DATABASE IF EXISTS portable_psql;
DROP DATABASE IF EXISTS portable_tle;
DROP DATABASE IF EXISTS portable_ext;
DROP DATABASE IF EXISTS rate_limit_regress;
DO \$\$ BEGIN CREATE ROLE rl_db_owner LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END \$\$;
DO \$\$ BEGIN CREATE ROLE rl_tle_admin LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END \$\$;
CREATE DATABASE portable_psql OWNER rl_db_owner;
CREATE DATABASE portable_tle OWNER rl_tle_admin;
CREATE DATABASE portable_ext OWNER rl_db_owner;
CREATE DATABASE rate_limit_regress OWNER rl_db_owner;
SQL
# psql -f, by the database's owner
psql_p -d portable_psql -U rl_db_owner -q -1 -f portable/rate_limit_portable.sql
expect_seed "psql -f" portable_psql rl_db_owner
# pg_tle: the superuser creates pg_tle (the service does) and grants pgtle_admin; its member installs
psql_p -d portable_tle -qc "CREATE EXTENSION pg_tle" -c "GRANT pgtle_admin TO rl_tle_admin"
psql_p -d portable_tle -U rl_tle_admin -q <<SQL
\\set file \`cat portable/rate_limit_portable.sql\`
SELECT pgtle.install_extension('rate_limit_portable', '$version',
    'Exact rate limiting inside PostgreSQL, portable edition', :'file');
CREATE EXTENSION rate_limit_portable;
SQL
expect_seed "pg_tle" portable_tle rl_tle_admin
[ "$(psql_p -d portable_tle -qAtc "SELECT extversion FROM pg_extension WHERE extname = 'rate_limit_portable'")" = "$version" ]
# the control file and its script, no library: CREATE EXTENSION by the database's owner (pg_tle refuses to
# install an extension whose control file exists, so the files come after its test; pg_tle is not created
# in this database)
cp portable/rate_limit_portable.control "$share/"
cp portable/rate_limit_portable.sql "$share/rate_limit_portable--$version.sql"
psql_p -d portable_ext -U rl_db_owner -qc "CREATE EXTENSION rate_limit_portable"
expect_seed "CREATE EXTENSION (no library)" portable_ext rl_db_owner
# an extension's policies and overrides are dumped with their rows
psql_p -d portable_ext -U rl_db_owner -qc "SELECT rate_limit.create_policy('dumped', 5, '1 minute')"
"$copy/bin/pg_dump" -h "$RATE_LIMIT_SOCKET_DIR" -p "$port" -U postgres -d portable_ext | grep -q "^dumped	token_bucket"

# 3. the examples, with the compiled edition's expected output
psql_p -d rate_limit_regress -U rl_db_owner -q -1 -f portable/rate_limit_portable.sql
PG_CACHE="$TEST_ROOT/portable-pg" run_regress "$v" "$port" rate_limit_regress "$TEST_ROOT/regress-portable-$v" \
  "${REGRESS_PORTABLE[@]}"

# 4. the integration tests of the features it has, in both servers' turn
conninfo() { echo "host=$RATE_LIMIT_SOCKET_DIR port=$1 user=postgres"; }
export RATE_LIMIT_TEST_EDITION=portable RATE_LIMIT_TEST_BINDIR="$copy/bin"
export RATE_LIMIT_TEST_CONNINFO RATE_LIMIT_TEST_PLAIN_CONNINFO
RATE_LIMIT_TEST_CONNINFO=$(conninfo "$port")
RATE_LIMIT_TEST_PLAIN_CONNINFO=$RATE_LIMIT_TEST_CONNINFO
tests=()
for t in adaptive batch blocks block_reads bookings charges coherence concurrency hierarchy hijack leases meters misuse overrides plans \
  policies purge_idle reservations reservations_many semantics shadow write_limits; do tests+=(--test "$t"); done
cargo test -p rate_limit_integration "${tests[@]}" -- --test-threads=1
# the clock steps and a calendar's month boundary, on the faketime cluster (its library unused here)
RATE_LIMIT_TEST_CONNINFO=$RATE_LIMIT_TEST_FAKETIME_CONNINFO \
  cargo test -p rate_limit_integration --test clock_steps --test calendar -- --test-threads=1
