#!/usr/bin/env bash
# Released upgrade scripts are never edited: each is in sql/released.sha256 and must match it, and every
# released version (sql/RELEASED) has its script to the next version, the newest one to the current
# version (Cargo.toml). Each script starts with the \echo ... \quit guard. Run by the lint step.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
(cd sql && sha256sum --quiet -c released.sha256) || { echo "a released upgrade script was edited (sql/released.sha256)" >&2; status=1; }
current=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
mapfile -t versions < <(grep -v '^#' sql/RELEASED | awk 'NF { print $1 }')
versions+=("$current")
for ((i = 0; i + 1 < ${#versions[@]}; i++)); do
  from=${versions[i]} to=${versions[i + 1]}
  [ "$from" != "$to" ] || continue
  script="sql/rate_limit--$from--$to.sql"
  if [ ! -f "$script" ]; then echo "missing upgrade script $script" >&2; status=1; continue; fi
  if ! grep -q '^\\echo .*\\quit$' <(sed -n '1,5p' "$script"); then
    echo "$script does not start with the \\echo ... \\quit guard" >&2; status=1
  fi
  if [ "$to" != "$current" ] && ! grep -q " rate_limit--$from--$to.sql\$" sql/released.sha256; then
    echo "$script is released but not in sql/released.sha256" >&2; status=1
  fi
done
exit $status
