//! The statistics views' functions and the reset (owner only): `rate_limit.stats`,
//! `rate_limit.top_limited` and `rate_limit.reset_stats`. 55000 when the library is not preloaded.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::cluster::merged::{self, StatsRow, TopRow};
use crate::stats;
use rate_limit_model::target::Kind;

/// `kind` and `policy` of a namespace, as `rate_limit.buckets` shows them.
fn kind_and_policy(name: &str) -> (String, Option<String>) {
    let (kind, policy) = Kind::of_stored_name(name);
    (kind.name().to_string(), policy.map(str::to_string))
}

fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn timestamp(us: i64) -> Option<TimestampWithTimeZone> {
    TimestampWithTimeZone::try_from(us).ok()
}

/// This node's statistics in the current database, with the `untracked` row last if there are any.
fn node_stats(function: &'static str) -> Result<Vec<StatsRow>, ErrorReport> {
    let mut rows: Vec<_> = stats::rows(function)?
        .into_iter()
        .map(|r| {
            let (kind, policy) = kind_and_policy(&r.name);
            (
                kind,
                policy,
                count(r.totals.calls),
                count(r.totals.granted),
                count(r.totals.denied),
                count(r.totals.tokens),
                r.last_denial.and_then(timestamp),
                timestamp(r.since),
            )
        })
        .collect();
    let untracked = stats::untracked(function)?;
    if untracked > 0 {
        rows.push((
            "untracked".to_string(),
            None,
            count(untracked),
            0,
            0,
            0,
            None,
            None,
        ));
    }
    Ok(rows)
}

/// This node's top limited keys in the current database, ranked per policy.
fn node_top_limited(function: &'static str) -> Result<Vec<TopRow>, ErrorReport> {
    let mut rows = Vec::new();
    for r in stats::rows(function)? {
        let (kind, policy) = kind_and_policy(&r.name);
        for (i, c) in r.top.iter().enumerate() {
            rows.push((
                kind.clone(),
                policy.clone(),
                i as i32 + 1,
                c.display_key(),
                count(c.count),
                count(c.count - c.error),
            ));
        }
    }
    Ok(rows)
}

/// The rows of `rate_limit.top_limited`: this node's, or on a Citus coordinator of a distributed database
/// the nodes' merged.
pub(crate) fn top_limited(function: &'static str) -> Result<Vec<TopRow>, ErrorReport> {
    match merged::top_limited(function)? {
        Some(rows) => Ok(rows),
        None => node_top_limited(function),
    }
}

/// Statistics SQL functions, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// One row per policy (and `rate_limiting_request`, the ad-hoc limits) with calls, plus an `untracked`
    /// row counting calls beyond `rate_limit.stats_max`, if any: this node's, or on a Citus coordinator of
    /// a distributed database the whole cluster's (summed over the nodes). For the `rate_limit.stats` view.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn stats_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(calls, i64),
                name!(granted, i64),
                name!(denied, i64),
                name!(tokens_granted, i64),
                name!(last_denial, Option<TimestampWithTimeZone>),
                name!(since, Option<TimestampWithTimeZone>),
            ),
        >,
        ErrorReport,
    > {
        const F: &str = "rate_limit.stats_rows";
        match merged::stats(F)? {
            Some(rows) => Ok(TableIterator::new(rows)),
            None => node_stats(F).map(TableIterator::new),
        }
    }

    /// This node's own rows of `rate_limit.stats`, also on a Citus coordinator (where the view merges
    /// every node's).
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn node_stats_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(calls, i64),
                name!(granted, i64),
                name!(denied, i64),
                name!(tokens_granted, i64),
                name!(last_denial, Option<TimestampWithTimeZone>),
                name!(since, Option<TimestampWithTimeZone>),
            ),
        >,
        ErrorReport,
    > {
        node_stats("rate_limit.node_stats_rows").map(TableIterator::new)
    }

    /// The most denied keys of each policy, most first, from the Space-Saving summary: each key was denied
    /// between `denials_min` and `denials` times since the statistics' `since`. This node's, or on a Citus
    /// coordinator of a distributed database the nodes' summaries merged. For the `rate_limit.top_limited`
    /// view.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn top_limited_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(rank, i32),
                name!(key, String),
                name!(denials, i64),
                name!(denials_min, i64),
            ),
        >,
        ErrorReport,
    > {
        top_limited("rate_limit.top_limited_rows").map(TableIterator::new)
    }

    /// This node's own rows of `rate_limit.top_limited`, also on a Citus coordinator.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn node_top_limited_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(rank, i32),
                name!(key, String),
                name!(denials, i64),
                name!(denials_min, i64),
            ),
        >,
        ErrorReport,
    > {
        node_top_limited("rate_limit.node_top_limited_rows").map(TableIterator::new)
    }

    /// Zeroes the statistics (and top limited keys) of every policy in this database, and of
    /// `rate_limiting_request` and the ad-hoc limits; returns how many were reset. Owner only.
    #[pg_extern(volatile, parallel_unsafe, name = "reset_stats")]
    fn reset_all_stats() -> Result<i64, ErrorReport> {
        stats::reset("rate_limit.reset_stats", None)
    }

    /// Zeroes the statistics (and top limited keys) of policy `policy` in this database; returns how many
    /// were reset (0 or 1). A NULL policy is 22004, never "everything": that is `reset_stats()`. Owner only.
    #[pg_extern(volatile, parallel_unsafe)]
    fn reset_stats(policy: Option<&str>) -> Result<i64, ErrorReport> {
        const F: &str = "rate_limit.reset_stats";
        let policy = policy.ok_or_else(|| {
            crate::error::null_argument(
                F,
                "policy",
                "Pass a policy's name, or call rate_limit.reset_stats() to reset everything.",
            )
        })?;
        stats::reset(F, Some(policy))
    }
}
