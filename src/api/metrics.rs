//! The functions under the monitoring views (`rate_limit.metrics`, `rate_limit.metrics_purge`; see
//! `sql/finalize.sql` and docs/operations.md): counters per policy that a Prometheus exporter reads, and the
//! background worker's last purges. Executable by the owner and by `pg_monitor`; 55000 when the library
//! is not preloaded.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::cluster::merged::{self, MetricsRow};
use crate::gucs;
use crate::stats;
use rate_limit_model::target::Kind;

fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// This node's counters in the current database, with the `untracked` row last if there are any. A
/// would-be denial of shadow mode is counted in `shadow_denied`, not in `denied` (which counts the calls
/// refused); `blocked` counts those of either that a block of their key decided.
fn node_metrics(function: &'static str) -> Result<Vec<MetricsRow>, ErrorReport> {
    let mut rows: Vec<MetricsRow> = stats::rows(function)?
        .into_iter()
        .map(|r| {
            let (kind, policy) = Kind::of_stored_name(&r.name);
            let t = r.totals;
            (
                kind.name().to_string(),
                policy.map(str::to_string),
                count(t.calls),
                count(t.granted),
                count(t.denied.saturating_sub(t.shadow_denied)),
                count(t.shadow_denied),
                count(t.blocked),
                count(t.tokens),
            )
        })
        .collect();
    let untracked = stats::untracked(function)?;
    if untracked > 0 {
        rows.push(("untracked".into(), None, count(untracked), 0, 0, 0, 0, 0));
    }
    Ok(rows)
}

/// Monitoring SQL functions, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Counters per policy (and for `rate_limiting_request` and the ad-hoc limits) of this database, plus
    /// an `untracked` row: this node's, or on a Citus coordinator of a distributed database every node's
    /// summed. For the `rate_limit.metrics` view.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn metrics_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(calls, i64),
                name!(granted, i64),
                name!(denied, i64),
                name!(shadow_denied, i64),
                name!(blocked, i64),
                name!(tokens_granted, i64),
            ),
        >,
        ErrorReport,
    > {
        const F: &str = "rate_limit.metrics_rows";
        match merged::metrics(F)? {
            Some(rows) => Ok(TableIterator::new(rows)),
            None => node_metrics(F).map(TableIterator::new),
        }
    }

    /// This node's own rows of `rate_limit.metrics_rows`, also on a Citus coordinator (where the view sums
    /// every node's).
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn node_metrics_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(calls, i64),
                name!(granted, i64),
                name!(denied, i64),
                name!(shadow_denied, i64),
                name!(blocked, i64),
                name!(tokens_granted, i64),
            ),
        >,
        ErrorReport,
    > {
        node_metrics("rate_limit.node_metrics_rows").map(TableIterator::new)
    }

    /// The background worker's last finished purge on this node: of this database's table store (rows
    /// deleted) and of the memory store (buckets deleted, every database's); a store without one since the
    /// server started has no row. For the `rate_limit.metrics_purge` view.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn purge_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(store, String),
                name!(finished_at, TimestampWithTimeZone),
                name!(freed, i64),
            ),
        >,
        ErrorReport,
    > {
        let (table, memory) = stats::last_purges("rate_limit.purge_rows")?;
        let rows: Vec<_> = [("table", table), ("memory", memory)]
            .into_iter()
            .filter_map(|(store, p)| {
                let p = p?;
                let at = TimestampWithTimeZone::try_from(p.at).ok()?;
                Some((store.to_string(), at, p.freed))
            })
            .collect();
        Ok(TableIterator::new(rows))
    }

    /// The most denied keys of each policy, as `rate_limit.top_limited` ranks them, up to
    /// `rate_limit.metrics_top_keys` per policy (none by default). For the `rate_limit.metrics_top_keys`
    /// view: a monitoring system's labels stay bounded, and so do the keys `pg_monitor` can read.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn metrics_top_keys_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(rank, i32),
                name!(key, String),
                name!(denials, i64),
            ),
        >,
        ErrorReport,
    > {
        let bound = gucs::metrics_top_keys();
        if bound == 0 {
            return Ok(TableIterator::new(Vec::new()));
        }
        let rows: Vec<_> = crate::api::stats::top_limited("rate_limit.metrics_top_keys_rows")?
            .into_iter()
            .filter(|r| usize::try_from(r.2).is_ok_and(|rank| rank <= bound))
            .map(|(kind, policy, rank, key, denials, _)| (kind, policy, rank, key, denials))
            .collect();
        Ok(TableIterator::new(rows))
    }
}
