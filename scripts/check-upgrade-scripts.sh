#!/usr/bin/env bash
# Released upgrade scripts are never edited: every upgrade script the newest released version (sql/RELEASED)
# shipped must be, byte for byte, the file its commit has (git show COMMIT:PATH); every released
# version has its script to the next version, the newest one to the current version (Cargo.toml); each
# script starts with the \echo ... \quit guard; the unreleased version's script is what sql/unreleased/*.sql
# assemble to (scripts/assemble-upgrade.sh). And the pg_regress examples: every file of
# tests/pg_regress/sql is in REGRESS_TESTS (scripts/cluster.sh) with an expected output, and every name
# there has its file (pg_regress skips an example without expected output silently). Run by the lint step.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
# the unreleased version's script is what its fragments assemble to
scripts/assemble-upgrade.sh --check >/dev/null || status=1
fail() { echo "$*" >&2; status=1; }
current=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
mapfile -t released < <(grep -v '^#' sql/RELEASED | awk 'NF { print $1 " " $2 }')
versions=()
for line in "${released[@]}"; do
  read -r version commit <<<"$line"
  versions+=("$version")
done
# the newest release ships every upgrade script up to it: each must be byte for byte that commit's file
read -r newest newest_commit <<<"${released[${#released[@]} - 1]}"
mapfile -t shipped < <(git ls-tree --name-only "$newest_commit" sql/ | grep '^sql/rate_limit--.*--.*\.sql$')
[ ${#shipped[@]} -gt 0 ] || fail "no upgrade script in $newest's commit $newest_commit (sql/RELEASED)"
for script in "${shipped[@]}"; do
  if [ ! -f "$script" ]; then
    fail "$script, released with $newest, was removed"
  elif ! cmp -s <(git show "$newest_commit:$script") "$script"; then
    fail "$script was edited after it was released with $newest (differs from $newest_commit:$script)"
  fi
done
# a release's tag, where the clone has it, names the commit sql/RELEASED names
for line in "${released[@]}"; do
  read -r version commit <<<"$line"
  tagged=$(git rev-parse -q --verify "refs/tags/v$version^{commit}" 2>/dev/null) || continue
  [ "$tagged" = "$(git rev-parse "$commit")" ] ||
    fail "tag v$version is $tagged, but sql/RELEASED says $version is $commit"
done
versions+=("$current")
for ((i = 0; i + 1 < ${#versions[@]}; i++)); do
  from=${versions[i]} to=${versions[i + 1]}
  [ "$from" != "$to" ] || continue
  script="sql/rate_limit--$from--$to.sql"
  if [ ! -f "$script" ]; then fail "missing upgrade script $script"; continue; fi
  if ! grep -q '^\\echo .*\\quit$' <(sed -n '1,5p' "$script"); then
    fail "$script does not start with the \\echo ... \\quit guard"
  fi
done

# shellcheck source=cluster.sh
source scripts/cluster.sh
listed=$(printf '%s\n' "${REGRESS_TESTS[@]}" | sort)
present=$(find tests/pg_regress/sql -name '*.sql' -printf '%f\n' | sed 's/\.sql$//' | sort)
[ "$listed" = "$present" ] ||
  fail "REGRESS_TESTS (scripts/cluster.sh) and tests/pg_regress/sql differ: $(diff <(echo "$listed") <(echo "$present") | grep '^[<>]' | tr '\n' ' ')"
for t in "${REGRESS_TESTS[@]}"; do
  [ -f "tests/pg_regress/expected/$t.out" ] || fail "tests/pg_regress/expected/$t.out is missing"
done
exit $status
