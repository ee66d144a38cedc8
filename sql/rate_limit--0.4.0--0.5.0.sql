-- rate_limit 0.4.0 -> 0.5.0. Assembled by scripts/assemble-upgrade.sh from sql/unreleased/*.sql,
-- one fragment per change: edit those, then assemble again. Frozen once 0.5.0 is in sql/RELEASED.
\echo Use "ALTER EXTENSION rate_limit UPDATE TO '0.5.0'" to load this file. \quit

-- No SQL object has changed since 0.4.0 yet.
