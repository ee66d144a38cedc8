#!/usr/bin/env bash
# The one benchmark runner: sets up once what every suite needs (the dependencies, cargo's path, the
# cluster helpers of scripts/cluster.sh and the shared functions of bench/lib.sh), then runs one suite of
# bench/suites/. Every figure is a ratio to `SELECT 1` measured in the same run (this machine is noisy).
#
#   bench/run.sh [SUITE]      SUITE (default every_call), each writing its report to bench/results/:
#     every_call        every call against SELECT 1, both stores (every_call.md, every_call.svg)
#     ab                every call, this build against an earlier revision's, in one run (ab_every_call.md)
#     one_core_ab       take, take_many and rate_limiting_request, this build against a revision (one_core_ab.md)
#     batch             take_batch against take in one statement, the bare scans, one upsert (batch.md)
#     batch_ab          one take_batch statement, this build against a revision (batch_ab.md)
#     overrides         per-key overrides at a million keys (overrides_million_keys.md)
#     portable          the portable edition against the compiled table store and the seed's function (portable.md)
#     router_hop        the PL/Proxy router's and Citus's hop against their floors (router_hop.md)
#     statistics_cost   the memory store's calls with the statistics on and off (statistics_cost.md)
#     allow             rate_limit.allow against rate_limiting_request and take, and in an application's lookup (allow.md)
#     allow_instructions  what allow and take add to that lookup, in instructions (callgrind) (allow_instructions.md)
#     allow_server_cpu    what allow adds to that lookup's server CPU, kernel included (allow_server_cpu.md)
#     reservations      reserve and settle against take, call by call, both stores (reservations.md)
#     adaptive          adaptive concurrency's acquire and release against fixed leases and takes (adaptive.md)
#     purge_ab          the background worker's purge under load, this build against a revision (purge_ab.md)
#
# Each suite's settings (BENCH_SECONDS, BENCH_ROUNDS, BENCH_CLIENTS, BENCH_BASELINE_REV, ...) are described
# at its top. The pgbench scripts are in bench/scenarios/, what the databases are filled with in
# bench/setup/. Every server is the suite's own, in a copy of the tests' PostgreSQL (never the tests' or the
# demo's installation, whose running servers would crash if their library were replaced in place).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SUITE=${1:-every_call}
[ $# -eq 0 ] || shift
if [ ! -f "bench/suites/$SUITE.sh" ]; then
  echo "bench/run.sh: no suite '$SUITE'; the suites: $(cd bench/suites && ls *.sh | sed 's/\.sh$//' | paste -sd' ')" >&2
  exit 2
fi
case $SUITE in
  router_hop) scripts/install-deps.sh --all ;; # PostgreSQL 17 and Citus too
  *) scripts/install-deps.sh ;;
esac
[ "$SUITE" != every_call ] || command -v gnuplot >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >/dev/null
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
# shellcheck source=lib.sh
source bench/lib.sh
# shellcheck source=/dev/null
source "bench/suites/$SUITE.sh"
