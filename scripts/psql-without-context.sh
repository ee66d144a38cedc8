#!/bin/sh
# pg_regress's launcher for psql (scripts/cluster.sh's run_regress): psql with SHOW_CONTEXT=never, so that an
# error prints its message, DETAIL and HINT but no CONTEXT line, whichever edition raised it.
exec "$@" -v SHOW_CONTEXT=never
