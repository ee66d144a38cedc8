//! `rate_limit.purge_idle()`, the purge to schedule with pg_cron where no background worker runs: the
//! worker's purge (full buckets untouched for an interval, read in the primary key's order, one short
//! transaction per span) from a `CALL`. The procedure is PL/pgSQL in `sql/finalize.sql`: a procedure that
//! commits between its steps can be neither `SECURITY DEFINER` nor carry a `SET` clause, so it runs as its
//! caller (EXECUTE revoked from PUBLIC) and calls, in each of its transactions, the owner-only
//! [`rate_limit::purge_span`] defined here.

/// The purge's span function, in schema `rate_limit`.
#[pgrx::pg_schema]
mod rate_limit {
    use pgrx::datum::Interval;
    use pgrx::pg_sys::panic::ErrorReport;
    use pgrx::prelude::*;

    use crate::error;
    use crate::policies;
    use crate::store;

    /// One transaction of `rate_limit.purge_idle`: the next [`store::PURGE_SPAN_ROWS`] rows of the state
    /// table after `(after_namespace, after_key)` (from its start when they are NULL), the full ones
    /// untouched for `idle` deleted (and, on the first span, the memory store's full buckets of this
    /// database, as `purge()` does). Returns how many it deleted and where the next span starts (NULL:
    /// the table's end). 0A000 under Citus, where each node's background worker purges its shards.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn purge_span(
        idle: Option<Interval>,
        after_namespace: Option<&str>,
        after_key: Option<&str>,
    ) -> Result<
        TableIterator<
            'static,
            (
                name!(deleted, i64),
                name!(next_namespace, Option<String>),
                name!(next_key, Option<String>),
            ),
        >,
        ErrorReport,
    > {
        const F: &str = "rate_limit.purge_idle";
        let idle = idle.ok_or_else(|| {
            error::null_argument(
                F,
                "idle",
                "Pass how long a full bucket must have been untouched, e.g. interval '5 minutes'.",
            )
        })?;
        let idle_us = policies::period_us(F, "idle", idle)?;
        let after = match (after_namespace, after_key) {
            (Some(namespace), Some(key)) => Some(store::PurgePosition {
                namespace: namespace.to_string(),
                key: key.to_string(),
            }),
            _ => None,
        };
        let span = store::purge_idle_span(F, after.as_ref(), idle_us)?;
        let (namespace, key) = match span.next {
            Some(p) => (Some(p.namespace), Some(p.key)),
            None => (None, None),
        };
        Ok(TableIterator::once((span.deleted, namespace, key)))
    }
}
