#!/usr/bin/env bash
# Writes the SQL made from the SQL surface's table (src/surface/): every function's privileges and
# comment (sql/finalize.sql's last section), the CREATE FUNCTION of the functions new in the unreleased
# version (sql/unreleased/000-new-functions.sql), the PL/Proxy router's calls (router/plproxy.sql); then
# assembles the unreleased upgrade script and the portable edition, which include parts of them. The lint
# fails while any of them is not what the table makes (the integration test `surface`, without a server).
set -euo pipefail
cd "$(dirname "$0")/.."
RATE_LIMIT_WRITE_GENERATED=1 cargo test -q -p rate_limit_integration --test surface \
  the_sql_made_from_the_table_is_in_its_files -- --nocapture
scripts/assemble-upgrade.sh
(cd portable && ./assemble.sh)
