#!/usr/bin/env bash
# A primary and its streaming standby for tests/integration/tests/failover.rs, which runs:
#   scripts/failover-pair.sh VERSION start MODE SKEW   a fresh pair: MODE sync or async replication; the
#                                                        standby's wall clock SKEW off the primary's (+0, +1h,
#                                                        -1h: libfaketime sets the primary's the other way)
#   scripts/failover-pair.sh VERSION promote           the primary dies (immediate stop), the standby is promoted
#   scripts/failover-pair.sh VERSION stop              both stopped
# Ports 6100+VERSION (primary) and 6150+VERSION (standby); rate_limit preloaded on both.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=cluster.sh
source scripts/cluster.sh
v=$1 action=$2
root=${RATE_LIMIT_TEST_DIR:-/var/tmp/rate_limit-test}
primary="$root/failover-primary-$v" standby="$root/failover-standby-$v"
primary_port=$((6100 + v)) standby_port=$((6150 + v))
bin=$(pg_bindir "$v")

case $action in
  start)
    mode=$3 skew=$4
    cluster_stop "$v" "$standby"
    cluster_stop "$v" "$primary"
    rm -rf "$primary" "$standby"
    sync_names="''"
    [ "$mode" = sync ] && sync_names="'*'"
    cluster_start "$v" "$primary" "$primary_port" "fsync = off" "shared_preload_libraries = 'rate_limit'" \
      "rate_limit.purge_interval = 0" "synchronous_standby_names = $sync_names" "wal_sender_timeout = 5s"
    # the skew: the primary's clock is set SKEW the other way (libfaketime fakes backends and WAL senders, but
    # not a standby's WAL receiver, whose receipt instants the standby's skew is measured with)
    lib=$(dpkg -L libfaketime | grep '/libfaketime.so.1$')
    primary_skew=$(echo "$skew" | tr '+-' '-+')
    as_pg "'$bin/pg_ctl' -D '$primary' -w stop" >/dev/null
    as_pg "LD_PRELOAD='$lib' FAKETIME='$primary_skew' FAKETIME_DONT_FAKE_MONOTONIC=1 '$bin/pg_ctl' -D '$primary' \
      -l '$primary/server.log' -w -t 60 start" >/dev/null
    as_pg "'$bin/pg_basebackup' -h '$RATE_LIMIT_SOCKET_DIR' -p $primary_port -U postgres -D '$standby' -R -X stream"
    # the copied configuration names a synchronous standby: once promoted, this server has none (a manager such
    # as Patroni rewrites it the same way), so its commits must not wait for one
    printf "port = %s\nsynchronous_standby_names = ''\n" "$standby_port" | as_pg "cat >> '$standby/postgresql.conf'"
    as_pg "'$bin/pg_ctl' -D '$standby' -l '$standby/server.log' -w -t 60 start" >/dev/null
    # the standby streams (and, for sync, is the synchronous one) before the test begins
    for _ in $(seq 100); do
      state=$(psql_at "$v" "$primary_port" -d postgres -Atc "SELECT sync_state FROM pg_stat_replication" || true)
      { [ "$mode" = sync ] && [ "$state" = sync ]; } || { [ "$mode" = async ] && [ "$state" = async ]; } && exit 0
      sleep 0.1
    done
    echo "the standby did not start streaming ($state)" >&2; exit 1 ;;
  promote)
    as_pg "'$bin/pg_ctl' -D '$primary' -m immediate -w stop" >/dev/null
    as_pg "'$bin/pg_ctl' -D '$standby' -w promote" >/dev/null ;;
  stop)
    cluster_stop "$v" "$standby"
    cluster_stop "$v" "$primary" ;;
  *) echo "usage: $0 VERSION start MODE SKEW | promote | stop" >&2; exit 2 ;;
esac
