#!/usr/bin/env bash
# Installs the PostgreSQL 15 .deb on a Debian system without Rust and runs the seed example there:
#   scripts/package-test.sh
# The system is a Debian 12 root made with debootstrap from this machine's own apt sources (kept in
# $RATE_LIMIT_CHROOT, default /var/tmp/rate_limit-chroot, and reused), with Debian's postgresql-15. The
# package is built by scripts/package.sh 15 and installed with apt (which resolves its Depends); a cluster
# of that root's PostgreSQL, preloading the library, runs tests/pg_regress/sql/seed_timeline.sql through
# psql, and the output must equal tests/pg_regress/expected/seed_timeline.out. Nothing is installed into
# this machine's own PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ "$(id -u)" = 0 ] || { echo "package-test.sh needs root (debootstrap, chroot)" >&2; exit 2; }
CHROOT=${RATE_LIMIT_CHROOT:-/var/tmp/rate_limit-chroot}

command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
scripts/package.sh 15

unmount() {
  for m in dev/pts dev proc; do umount "$CHROOT/$m" 2>/dev/null || true; done
}
trap unmount EXIT
mount_system() {
  mount --bind /proc "$CHROOT/proc"
  mount --bind /dev "$CHROOT/dev"
  mount --bind /dev/pts "$CHROOT/dev/pts"
}

if [ ! -x "$CHROOT/usr/lib/postgresql/15/bin/postgres" ]; then
  rm -rf "$CHROOT"
  # the mirror this machine's apt uses
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list)
  debootstrap --variant=minbase bookworm "$CHROOT" "$mirror" >"$ROOT/target/package/debootstrap.log" 2>&1 ||
    { tail -20 "$ROOT/target/package/debootstrap.log"; exit 1; }
  mount_system
  # the distribution's server, without starting a cluster of its own
  mkdir -p "$CHROOT/etc/postgresql-common/createcluster.d"
  echo "create_main_cluster = false" >"$CHROOT/etc/postgresql-common/createcluster.d/no-main.conf"
  cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
  chroot "$CHROOT" apt-get update -qq
  chroot "$CHROOT" apt-get install -y -qq postgresql-15 >/dev/null
else
  mount_system
fi
if chroot "$CHROOT" sh -c 'command -v cargo || command -v rustc'; then
  echo "the test system has Rust: it cannot show that the package installs without it" >&2
  exit 1
fi

deb=$(ls "$ROOT"/target/package/postgresql-15-rate-limit_*.deb)
cp "$deb" "$CHROOT/tmp/"
chroot "$CHROOT" apt-get install -y -qq --reinstall "/tmp/$(basename "$deb")" >/dev/null
chroot "$CHROOT" dpkg -s postgresql-15-rate-limit | sed -n 's/^\(Package\|Version\|Status\): /  \1: /p'

data=/var/tmp/rate_limit-deb-test
chroot "$CHROOT" sh -c "rm -rf $data && mkdir -p $data && chown postgres $data"
bin=/usr/lib/postgresql/15/bin
chroot "$CHROOT" su postgres -s /bin/sh -c "$bin/initdb -D $data/db -A trust -U postgres --no-sync >/dev/null &&
  $bin/pg_ctl -D $data/db -l $data/server.log -w -t 60 \
    -o \"-c shared_preload_libraries=rate_limit -c listen_addresses='' -c unix_socket_directories=$data -p 5998\" start >/dev/null"
stop() {
  chroot "$CHROOT" su postgres -s /bin/sh -c "$bin/pg_ctl -D $data/db -m fast -w stop" >/dev/null 2>&1 || true
  unmount
}
trap stop EXIT
cp tests/pg_regress/sql/seed_timeline.sql "$CHROOT/tmp/"
psql="$bin/psql -X -h $data -p 5998 -U postgres -d postgres"
chroot "$CHROOT" su postgres -s /bin/sh -c "$psql -qc 'CREATE EXTENSION rate_limit'"
# as pg_regress runs a test file: echo every query, no NOTICEs
chroot "$CHROOT" su postgres -s /bin/sh -c \
  "PGOPTIONS='-c client_min_messages=warning' $psql -a -q -f /tmp/seed_timeline.sql" >"$ROOT/target/package/seed_timeline.out" 2>&1
if diff -u tests/pg_regress/expected/seed_timeline.out "$ROOT/target/package/seed_timeline.out"; then
  echo "the .deb installed without Rust and ran the seed example: $(basename "$deb")"
else
  echo "FAILED: the seed example's output differs (above)"
  exit 1
fi
