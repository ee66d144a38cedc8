#!/usr/bin/env bash
# Assembles the upgrade script of the unreleased version from its fragments: sql/unreleased/*.sql, one per
# change, in name order, after a header, into sql/rate_limit--RELEASED--CURRENT.sql (RELEASED: the newest
# version in sql/RELEASED; CURRENT: Cargo.toml's). A change to the SQL adds or edits its own fragment, so the
# next version's script never grows by hand for months; at release the version goes into sql/RELEASED and
# the fragments are deleted (the assembled script is then frozen by scripts/check-upgrade-scripts.sh). The
# script ends with every function's privileges and comment, the section of sql/finalize.sql made from
# src/surface/ (scripts/generate-surface.sh), as a fresh install has them.
#
#   scripts/assemble-upgrade.sh           writes the script
#   scripts/assemble-upgrade.sh --check   fails if the script is not what the fragments assemble to (lint)
set -euo pipefail
cd "$(dirname "$0")/.."
current=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
released=$(grep -v '^#' sql/RELEASED | awk 'NF { v = $1 } END { print v }')
script="sql/rate_limit--$released--$current.sql"
shopt -s nullglob
fragments=(sql/unreleased/*.sql)
if [ "$released" = "$current" ]; then
  if [ ${#fragments[@]} = 0 ]; then
    echo "$current is released and no fragment is in sql/unreleased: nothing to assemble"
    exit 0
  fi
  echo "$current is released: name the next version in Cargo.toml before its first fragment" >&2
  exit 1
fi
assembled() {
  echo "-- rate_limit $released -> $current. Assembled by scripts/assemble-upgrade.sh from sql/unreleased/*.sql,"
  echo "-- one fragment per change: edit those, then assemble again. Frozen once $current is in sql/RELEASED."
  echo "\\echo Use \"ALTER EXTENSION rate_limit UPDATE TO '$current'\" to load this file. \\quit"
  local f
  for f in "${fragments[@]}"; do
    echo
    cat "$f"
  done
  if [ ${#fragments[@]} = 0 ]; then
    echo
    echo "-- No SQL object has changed since $released yet."
  fi
  echo
  echo "-- Every function's privileges and comment, as sql/finalize.sql gives a fresh install:"
  sed -n '/^-- BEGIN made from src\/surface\//,/^-- END made from src\/surface\//p' sql/finalize.sql
}
if [ "${1:-}" = --check ]; then
  if ! cmp -s <(assembled) "$script"; then
    echo "$script is not what sql/unreleased/*.sql assemble to: run scripts/assemble-upgrade.sh" >&2
    diff <(assembled) "$script" | head -20 >&2
    exit 1
  fi
  echo "$script is assembled from its ${#fragments[@]} fragments"
else
  assembled >"$script"
  echo "wrote $script from ${#fragments[@]} fragments"
fi
