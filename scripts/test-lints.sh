#!/usr/bin/env bash
# The structure lints catch what they say: each must fail on its fixture (scripts/lint-fixtures/), naming
# what it found there, and pass on this repository. Run by the lint step of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
FIXTURES=scripts/lint-fixtures

expect_failure() { # expect_failure WHAT EXPECTED-LINE COMMAND...: fails unless COMMAND exits 1 printing EXPECTED-LINE
  local what=$1 expected=$2 out status=0
  shift 2
  out=$("$@" 2>&1) || status=$?
  if [ "$status" != 1 ] || ! grep -qxF -- "$expected" <<<"$out"; then
    echo "lint test failed: $what (exit $status):"
    echo "$out"
    return 1
  fi
  echo "ok: $what"
}

expect_failure "the cycle lint finds a circle below the top level" \
  "import circle in crate::deep: x -> y -> x" python3 scripts/check-module-cycles.py "$FIXTURES/cycles/src"
expect_failure "the size lint reads past a #[cfg(test)] item to the file's end" \
  "src/long.rs: fn long has 89 lines (at most 80)" python3 scripts/check-sizes.py "$FIXTURES/sizes"
python3 scripts/check-module-cycles.py
python3 scripts/check-sizes.py
