#!/usr/bin/env bash
# Throwaway PostgreSQL clusters for the demo, the tests and the benchmarks. Source it, then:
#   pg_bindir 15                    -> the bin directory of the tests' own PostgreSQL 13 to 18 (built or from PyPI)
#   system_pg_bindir                -> Debian's PostgreSQL 15, which only the demo uses
#   cluster_start 15 DIR PORT [conf lines...]   initdb if needed (as the postgres user), start, wait; the
#                                   server runs with $RATE_LIMIT_SERVER_ENVIRONMENT (e.g. RUST_BACKTRACE=1)
#   cluster_stop 15 DIR
# Clusters listen only on a Unix socket in $RATE_LIMIT_SOCKET_DIR (default /var/tmp/rate_limit-sock), a
# directory only its owner (postgres when run as root, else the user) and root may enter, with trust
# authentication, superuser "postgres". PostgreSQL refuses to run as root, so as root every server
# command runs as the postgres user.

PG_CACHE=${RATE_LIMIT_PG_CACHE:-/opt/rate_limit-pg}
RATE_LIMIT_SOCKET_DIR=${RATE_LIMIT_SOCKET_DIR:-/var/tmp/rate_limit-sock}

pg_bindir() {
  if [ "$1" = system ]; then echo /usr/lib/postgresql/15/bin; else echo "$PG_CACHE/$1/bin"; fi
}

as_pg() { # run a command line as the postgres user when we are root
  if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi
}

cluster_start() {
  local version=$1 dir=$2 port=$3 bindir
  shift 3
  bindir=$(pg_bindir "$version")
  mkdir -p "$RATE_LIMIT_SOCKET_DIR" "$(dirname "$dir")"
  if [ "$(id -u)" = 0 ]; then chown postgres "$RATE_LIMIT_SOCKET_DIR" "$(dirname "$dir")"; fi
  # trust authentication: only the clusters' owner (and root) may enter the socket directory
  chmod 700 "$RATE_LIMIT_SOCKET_DIR"
  if [ ! -f "$dir/PG_VERSION" ]; then
    as_pg "'$bindir/initdb' -D '$dir' -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8" >/dev/null
    {
      echo "port = $port"
      echo "listen_addresses = ''"
      echo "unix_socket_directories = '$RATE_LIMIT_SOCKET_DIR'"
      echo "max_connections = 120"
      echo "shared_buffers = 256MB"
      for line in "$@"; do echo "$line"; done
    } | as_pg "cat >> '$dir/postgresql.conf'"
  fi
  if ! as_pg "'$bindir/pg_ctl' -D '$dir' status" >/dev/null 2>&1; then
    as_pg "${RATE_LIMIT_SERVER_ENVIRONMENT:-} '$bindir/pg_ctl' -D '$dir' -l '$dir/server.log' -w -t 60 start" >/dev/null
  fi
}

cluster_stop() {
  local version=$1 dir=$2
  if [ -f "$dir/postmaster.pid" ]; then
    as_pg "'$(pg_bindir "$version")/pg_ctl' -D '$dir' -m fast -w stop" >/dev/null 2>&1 || true
  fi
}

# psql against a cluster started above: psql_at VERSION PORT [psql args...]
psql_at() {
  local version=$1 port=$2
  shift 2
  "$(pg_bindir "$version")/psql" -X -v ON_ERROR_STOP=1 -h "$RATE_LIMIT_SOCKET_DIR" -p "$port" -U postgres "$@"
}

# The pg_regress examples of tests/pg_regress against an existing database:
#   run_regress VERSION PORT DATABASE OUTPUT_DIR TEST...
# with the settings of `cargo pgrx regress` (no NOTICEs in the expected files) and psql told to print no
# CONTEXT lines (the portable edition's errors come from PL/pgSQL, which adds one to each: the same examples
# must print the same in both editions); prints the diffs on failure.
run_regress() {
  local version=$1 port=$2 db=$3 out=$4 pgxs
  shift 4
  pgxs=$("$(pg_bindir "$version")/pg_config" --pgxs)
  rm -rf "$out" && mkdir -p "$out"
  [ "$(id -u)" != 0 ] || chown postgres "$out"
  PGOPTIONS="-c client_min_messages=warning" "$(dirname "$(dirname "$pgxs")")/test/regress/pg_regress" \
    --launcher="$(pwd)/scripts/psql-without-context.sh" \
    --use-existing --dbname="$db" --host="$RATE_LIMIT_SOCKET_DIR" --port="$port" \
    --user=postgres --inputdir="$(pwd)/tests/pg_regress" --outputdir="$out" \
    --bindir="$(pg_bindir "$version")" "$@" ||
    { cat "$out/regression.diffs" 2>/dev/null; return 1; }
}

# The pg_regress examples, in order (setup creates the extension), one feature per file: REGRESS_TESTS for the
# compiled edition, REGRESS_PORTABLE the files of the features the portable edition has too, run against it
# with the same expected output (scripts/portable-test.sh installs it instead of setup).
REGRESS_TESTS=(setup seed_timeline management transactions errors permissions memory_store bounds bounds_settings
  policies policy_errors policy_options postgrest write_limits statistics shadow_mode shadow_switch charges reservations
  weighted_meters reservations_many hierarchy bookings calendar_windows concurrency_leases adaptive_concurrency blocks batches
  monitoring monitoring_policies nothing_left_behind)
REGRESS_PORTABLE=(seed_timeline management transactions errors permissions bounds policies policy_errors
  policy_options write_limits shadow_mode charges reservations weighted_meters reservations_many hierarchy bookings
  calendar_windows concurrency_leases adaptive_concurrency blocks batches monitoring_policies nothing_left_behind)
