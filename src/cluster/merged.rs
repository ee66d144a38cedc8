//! Cluster-wide statistics, top limited keys and memory buckets on a Citus coordinator.
//!
//! Each node counts the calls it ran and holds its own memory buckets (a delegated call counts on its key's
//! node). On the coordinator of a distributed database, `rate_limit.stats`, `rate_limit.top_limited` and
//! the memory-store rows of `rate_limit.buckets` merge every node's own answer, which the `node_*`
//! functions give, fetched with Citus's `run_command_on_all_nodes` as JSON and merged in one query here:
//! - statistics: counters summed, the last denial the latest, `since` the earliest;
//! - top limited keys: the nodes' Space-Saving summaries merged. A key's `denials_min` is the sum of its
//!   lower bounds; its `denials` adds, for every node whose summary is full and does not list it, that
//!   summary's smallest count (what the key may have had there), so both stay bounds of the true count,
//!   and every key denied more than 1/32 of a policy's denials on some node is listed;
//! - memory buckets: every node's rows (a key's bucket lives on one node);
//! - the counters of `rate_limit.metrics`: summed.
//!
//! Elsewhere (no Citus, not distributed, a worker) the views show this node's own figures.

use pgrx::datum::{
    AnyNumeric, DatumWithOid, FromDatum, Interval, IntoDatum, TimestampWithTimeZone,
};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{Spi, SpiHeapTupleData};
use rate_limit_model::summary::TOP_KEYS;

use super::citus;
use crate::error;

/// A row of `rate_limit.stats`.
pub type StatsRow = (
    String,
    Option<String>,
    i64,
    i64,
    i64,
    i64,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
);

/// A row of `rate_limit.metrics`: kind, policy, then calls, granted, denied, shadow_denied, blocked and
/// tokens_granted.
pub type MetricsRow = (String, Option<String>, i64, i64, i64, i64, i64, i64);

/// A row of `rate_limit.top_limited`.
pub type TopRow = (String, Option<String>, i32, String, i64, i64);

/// A memory-store row of `rate_limit.buckets`.
pub type MemoryBucketRow = (
    String,
    Option<String>,
    String,
    AnyNumeric,
    i64,
    i64,
    Option<Interval>,
    String,
    Option<TimestampWithTimeZone>,
);

/// The node's own statistics, as JSON.
const STATS_ON_NODE: &str = "SELECT COALESCE(pg_catalog.json_agg(s), '[]') \
                             FROM rate_limit.node_stats_rows() AS s";

const MERGE_STATS: &str = "SELECT s.kind, s.policy, pg_catalog.sum(s.calls)::pg_catalog.int8, \
       pg_catalog.sum(s.granted)::pg_catalog.int8, pg_catalog.sum(s.denied)::pg_catalog.int8, \
       pg_catalog.sum(s.tokens_granted)::pg_catalog.int8, pg_catalog.max(s.last_denial), pg_catalog.min(s.since) \
     FROM pg_catalog.unnest($1::pg_catalog.text[]) AS r(result), \
       pg_catalog.json_to_recordset(r.result::pg_catalog.json) AS s(kind pg_catalog.text, policy pg_catalog.text, calls pg_catalog.int8, granted pg_catalog.int8, \
         denied pg_catalog.int8, tokens_granted pg_catalog.int8, last_denial pg_catalog.timestamptz, since pg_catalog.timestamptz) \
     GROUP BY s.kind, s.policy \
     ORDER BY s.kind OPERATOR(pg_catalog.=) 'untracked', s.kind, s.policy";

/// The node's own counters for `rate_limit.metrics`, as JSON.
const METRICS_ON_NODE: &str = "SELECT COALESCE(pg_catalog.json_agg(m), '[]') \
                               FROM rate_limit.node_metrics_rows() AS m";

const MERGE_METRICS: &str = "SELECT m.kind, m.policy, pg_catalog.sum(m.calls)::pg_catalog.int8, \
       pg_catalog.sum(m.granted)::pg_catalog.int8, pg_catalog.sum(m.denied)::pg_catalog.int8, \
       pg_catalog.sum(m.shadow_denied)::pg_catalog.int8, pg_catalog.sum(m.blocked)::pg_catalog.int8, \
       pg_catalog.sum(m.tokens_granted)::pg_catalog.int8 \
     FROM pg_catalog.unnest($1::pg_catalog.text[]) AS r(result), \
       pg_catalog.json_to_recordset(r.result::pg_catalog.json) AS m(kind pg_catalog.text, policy pg_catalog.text, calls pg_catalog.int8, granted pg_catalog.int8, \
         denied pg_catalog.int8, shadow_denied pg_catalog.int8, blocked pg_catalog.int8, tokens_granted pg_catalog.int8) \
     GROUP BY m.kind, m.policy \
     ORDER BY m.kind OPERATOR(pg_catalog.=) 'untracked', m.kind, m.policy";

/// The node's own top limited keys, as JSON.
const TOP_ON_NODE: &str = "SELECT COALESCE(pg_catalog.json_agg(t), '[]') \
                           FROM rate_limit.node_top_limited_rows() AS t";

/// `$2` is the number of counters of a full summary.
const MERGE_TOP: &str = "WITH n AS ( \
       SELECT r.node, t.kind, t.policy, pg_catalog.json_build_array(t.kind, t.policy)::pg_catalog.text AS g, \
              t.key, t.denials, t.denials_min \
       FROM pg_catalog.unnest($1::pg_catalog.text[]) WITH ORDINALITY AS r(result, node), \
         pg_catalog.json_to_recordset(r.result::pg_catalog.json) AS t(kind pg_catalog.text, policy pg_catalog.text, key pg_catalog.text, denials pg_catalog.int8, \
           denials_min pg_catalog.int8)), \
     summaries AS ( \
       SELECT node, g, kind, policy, \
              CASE WHEN pg_catalog.count(*) OPERATOR(pg_catalog.>=) $2 THEN pg_catalog.min(denials) \
                   ELSE 0 END AS floor \
       FROM n GROUP BY node, g, kind, policy), \
     merged AS ( \
       SELECT s.kind, s.policy, k.g, k.key, \
              pg_catalog.sum(COALESCE(n.denials, s.floor))::pg_catalog.int8 AS denials, \
              pg_catalog.sum(COALESCE(n.denials_min, 0))::pg_catalog.int8 AS denials_min \
       FROM (SELECT DISTINCT g, key FROM n) AS k \
       JOIN summaries AS s ON s.g OPERATOR(pg_catalog.=) k.g \
       LEFT JOIN n ON n.node OPERATOR(pg_catalog.=) s.node AND n.g OPERATOR(pg_catalog.=) k.g \
                  AND n.key OPERATOR(pg_catalog.=) k.key \
       GROUP BY s.kind, s.policy, k.g, k.key) \
     SELECT kind, policy, \
            (pg_catalog.row_number() OVER (PARTITION BY g ORDER BY denials DESC, denials_min DESC, key))::pg_catalog.int4 \
              AS rank, \
            key, denials, denials_min \
     FROM merged ORDER BY kind, policy, rank";

/// The node's own memory buckets, as JSON.
const MEMORY_ON_NODE: &str = "SELECT COALESCE(pg_catalog.json_agg(m), '[]') \
                              FROM rate_limit.node_memory_buckets() AS m";

const MERGE_MEMORY: &str = "SELECT m.kind, m.policy, m.key, m.tokens, m.\"limit\", m.rate, m.per, m.algorithm, \
       m.updated_at \
     FROM pg_catalog.unnest($1::pg_catalog.text[]) AS r(result), \
       pg_catalog.json_to_recordset(r.result::pg_catalog.json) AS m(kind pg_catalog.text, policy pg_catalog.text, key pg_catalog.text, tokens pg_catalog.numeric, \
         \"limit\" pg_catalog.int8, rate pg_catalog.int8, per pg_catalog.interval, algorithm pg_catalog.text, updated_at pg_catalog.timestamptz) \
     ORDER BY m.kind, m.policy, m.key";

/// Column `i` (1-based) of a merged row; these queries never return NULL where the type says otherwise.
fn column<T: FromDatum + IntoDatum>(
    function: &'static str,
    row: &SpiHeapTupleData<'_>,
    i: usize,
) -> Result<Option<T>, ErrorReport> {
    row.get::<T>(i).map_err(|e| error::internal(function, e))
}

fn required<T: FromDatum + IntoDatum>(
    function: &'static str,
    row: &SpiHeapTupleData<'_>,
    i: usize,
) -> Result<T, ErrorReport> {
    column(function, row, i)?.ok_or_else(|| error::bug(function, "a merged column is NULL"))
}

/// Runs `merge` over every node's answer to `on_node` and reads its rows with `read`; `None` when this
/// node's own answer is the answer.
fn merged<R>(
    function: &'static str,
    on_node: &str,
    merge: &str,
    read: impl Fn(&SpiHeapTupleData<'_>) -> Result<R, ErrorReport>,
) -> Result<Option<Vec<R>>, ErrorReport> {
    match citus::on_every_node(function, on_node)? {
        Some(answers) => merge_answers(function, answers, merge, read).map(Some),
        None => Ok(None),
    }
}

/// Runs `merge` over `answers` (one JSON array of rows per node) and reads its rows with `read`.
fn merge_answers<R>(
    function: &'static str,
    answers: Vec<String>,
    merge: &str,
    read: impl Fn(&SpiHeapTupleData<'_>) -> Result<R, ErrorReport>,
) -> Result<Vec<R>, ErrorReport> {
    Spi::connect(|client| {
        // $2 (the counters of a full summary) is used by MERGE_TOP only; typed, it may go unused
        let args: [DatumWithOid<'_>; 2] = [answers.into(), (TOP_KEYS as i64).into()];
        let table = client
            .select(merge, None, &args)
            .map_err(|e| error::internal(function, e))?;
        table.map(|row| read(&row)).collect::<Result<Vec<_>, _>>()
    })
}

fn top_row(function: &'static str, r: &SpiHeapTupleData<'_>) -> Result<TopRow, ErrorReport> {
    Ok((
        required(function, r, 1)?,
        column(function, r, 2)?,
        required(function, r, 3)?,
        required(function, r, 4)?,
        required(function, r, 5)?,
        required(function, r, 6)?,
    ))
}

/// The cluster's statistics, or `None` when this node's own are the answer.
pub fn stats(function: &'static str) -> Result<Option<Vec<StatsRow>>, ErrorReport> {
    merged(function, STATS_ON_NODE, MERGE_STATS, |r| {
        Ok((
            required(function, r, 1)?,
            column(function, r, 2)?,
            required(function, r, 3)?,
            required(function, r, 4)?,
            required(function, r, 5)?,
            required(function, r, 6)?,
            column(function, r, 7)?,
            column(function, r, 8)?,
        ))
    })
}

/// The cluster's counters for `rate_limit.metrics` (every node's summed), or `None` when this node's own
/// are the answer.
pub fn metrics(function: &'static str) -> Result<Option<Vec<MetricsRow>>, ErrorReport> {
    merged(function, METRICS_ON_NODE, MERGE_METRICS, |r| {
        Ok((
            required(function, r, 1)?,
            column(function, r, 2)?,
            required(function, r, 3)?,
            required(function, r, 4)?,
            required(function, r, 5)?,
            required(function, r, 6)?,
            required(function, r, 7)?,
            required(function, r, 8)?,
        ))
    })
}

/// The cluster's top limited keys, or `None` when this node's own are the answer.
pub fn top_limited(function: &'static str) -> Result<Option<Vec<TopRow>>, ErrorReport> {
    merged(function, TOP_ON_NODE, MERGE_TOP, |r| top_row(function, r))
}

/// Every node's memory buckets, or `None` when this node's own are the answer.
pub fn memory_buckets(function: &'static str) -> Result<Option<Vec<MemoryBucketRow>>, ErrorReport> {
    merged(function, MEMORY_ON_NODE, MERGE_MEMORY, |r| {
        Ok((
            required(function, r, 1)?,
            column(function, r, 2)?,
            required(function, r, 3)?,
            required(function, r, 4)?,
            required(function, r, 5)?,
            required(function, r, 6)?,
            column(function, r, 7)?,
            required(function, r, 8)?,
            column(function, r, 9)?,
        ))
    })
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// One node's answer: `(key, denials, denials_min)` of policy `p`.
    fn answer(rows: &[(String, i64, i64)]) -> String {
        let rows: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(i, (key, denials, min))| {
                serde_json::json!({"kind": "policy", "policy": "p", "rank": i + 1, "key": key,
                                   "denials": denials, "denials_min": min})
            })
            .collect();
        serde_json::Value::Array(rows).to_string()
    }

    /// Merged Space-Saving summaries: bounds add up, and a node whose summary is full and does not list
    /// a key may have denied it up to its smallest count, which the upper bound includes.
    #[pg_test]
    fn top_limited_summaries_merge_into_bounds_of_the_true_counts() {
        // node 1: full (32 keys, counts 100 down to 5, "k0" with no error), without "x"
        let full: Vec<_> = (0..super::TOP_KEYS as i64)
            .map(|i| (format!("k{i}"), 100 - 3 * i, 100 - 3 * i - i64::from(i > 0)))
            .collect();
        let floor = full.last().map(|r| r.1).unwrap_or_default();
        // node 2: not full, lists "x" and "k0"
        let partial = vec![("x".to_string(), 7, 7), ("k0".to_string(), 2, 2)];
        let rows = super::merge_answers(
            "test",
            vec![answer(&full), answer(&partial)],
            super::MERGE_TOP,
            |r| super::top_row("test", r),
        )
        .expect("merge");
        let find = |k: &str| rows.iter().find(|r| r.3 == k).cloned().expect("listed");
        // listed on both: sums of both bounds
        assert_eq!(
            find("k0"),
            ("policy".into(), Some("p".into()), 1, "k0".into(), 102, 102)
        );
        // missing from the full summary: its floor joins the upper bound, not the lower one
        let x = find("x");
        assert_eq!((x.4, x.5), (7 + floor, 7));
        // missing from the partial summary: nothing added (that node never evicted a count)
        let k5 = find("k5");
        assert_eq!((k5.4, k5.5), (85, 84));
        assert_eq!(rows.len(), super::TOP_KEYS + 1);
        let ranks: Vec<i32> = rows.iter().map(|r| r.2).collect();
        assert_eq!(ranks, (1..=super::TOP_KEYS as i32 + 1).collect::<Vec<_>>());
    }
}
