//! Deleting full rows of the table store: `rate_limit.purge()` in one statement, and the background
//! worker's purge in spans, each its own short transaction.
//!
//! The worker's purge must not cost the callers anything they would notice. A caller whose row the
//! worker has locked waits for the worker's transaction to end, so each transaction reads a bounded span of
//! rows ([`purge_span`]: the next rows in the primary key's order, from where the last one stopped) instead
//! of scanning the table until it has found a batch to delete: its locks are held for the time it takes to
//! read one span, whatever the table's size, and a round reads each row once (a scan from the table's start
//! would read the rows the earlier batches deleted again, a round quadratic in its batches). And it deletes
//! only buckets idle for at least the purge interval: a bucket in use that refills between its calls is full
//! at most instants, and deleting it would make its next call insert it again (and wait for the worker's
//! lock first), so keys in constant use are never churned.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::Spi;

use super::{spi, timestamptz};
use crate::time::clock;

/// Every full row, in one statement, in the caller's transaction (`rate_limit.purge()`).
const PURGE: &str = "DELETE FROM rate_limit.bucket_state AS s \
     WHERE rate_limit.state_is_full(s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst, $1)";

/// The state table when it is not distributed.
pub const STATE_TABLE: &str = "rate_limit.bucket_state";

/// Deletes every bucket that is full now, losslessly (a missing bucket is a full one); returns how many.
pub fn purge(function: &'static str) -> Result<i64, ErrorReport> {
    let now = timestamptz(function, clock::table_now_us())?;
    Spi::connect_mut(|client| {
        let args: [DatumWithOid<'_>; 1] = [now.into()];
        let deleted = spi(function, client.update(PURGE, None, &args))?.len();
        Ok(i64::try_from(deleted).unwrap_or(i64::MAX))
    })
}

/// The tables the background worker purges on this node: [`STATE_TABLE`], or under Citus the shards of it
/// this node holds, each named directly (see [`crate::cluster::citus::local_shards`]), so that each node's
/// worker purges its own buckets and never another node's.
pub fn targets(function: &'static str) -> Result<Vec<String>, ErrorReport> {
    Ok(crate::cluster::citus::local_shards(function)?.unwrap_or_else(|| vec![STATE_TABLE.into()]))
}

/// Where a span of the worker's purge ended: the primary key of the last row it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The row's `namespace`.
    pub namespace: String,
    /// The row's `key`.
    pub key: String,
}

/// What one span of the worker's purge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The rows it deleted.
    pub deleted: i64,
    /// Where the next span starts (after this row); `None` when this span reached the table's end.
    pub next: Option<Position>,
}

/// The statement of one span of `table` (which must be [`STATE_TABLE`] or a shard's qualified name from
/// [`targets`]), starting after the row `($4, $5)` or, without `after`, at the table's start: the next `$2`
/// rows in the primary key's order are read (an index scan that stops after them), and those full at `$1`
/// and untouched since `$3` are locked with SKIP LOCKED (a row a caller holds is left for the next round;
/// the worker never waits for a caller) and deleted, checked again as they are. Returns how many it deleted,
/// how many it read and the last one's key (no row when the span is empty).
fn span_statement(table: &str, after: bool) -> String {
    let start = if after {
        "WHERE ROW(s.namespace, s.key) OPERATOR(pg_catalog.>) ROW($4::pg_catalog.text, $5::pg_catalog.text)"
    } else {
        ""
    };
    let idle_and_full = |row: &str| {
        format!(
            "{row}.updated_at OPERATOR(pg_catalog.<=) $3 AND rate_limit.state_is_full({row}.level, \
             {row}.updated_at, {row}.algorithm, {row}.rate, {row}.per_us, {row}.burst, $1)"
        )
    };
    format!(
        "WITH span AS MATERIALIZED ( \
             SELECT s.ctid AS row_id, s.namespace, s.key FROM {table} AS s {start} \
             ORDER BY s.namespace, s.key LIMIT $2), \
         gone AS ( \
             DELETE FROM {table} AS d \
             WHERE d.ctid OPERATOR(pg_catalog.=) ANY (ARRAY( \
                 SELECT f.ctid FROM {table} AS f \
                 WHERE f.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT row_id FROM span)) AND {f} \
                 FOR UPDATE SKIP LOCKED)) \
               AND {d} \
             RETURNING 1) \
         SELECT (SELECT pg_catalog.count(*) FROM gone), (SELECT pg_catalog.count(*) FROM span), \
                last.namespace, last.key \
         FROM span AS last ORDER BY last.namespace DESC, last.key DESC LIMIT 1",
        f = idle_and_full("f"),
        d = idle_and_full("d"),
    )
}

/// One span of the background worker's purge of `table` (see [`span_statement`]): at most `rows` rows
/// read after `after`, the full ones untouched for `idle_us` microseconds deleted. Run it in a transaction
/// of its own: the rows it deletes stay locked until that transaction ends.
pub fn purge_span(
    function: &'static str,
    table: &str,
    after: Option<&Position>,
    rows: i64,
    idle_us: i64,
) -> Result<Span, ErrorReport> {
    // the shard list is read again in each span's transaction: it also allows direct changes to the shards
    // for that transaction, and a shard moved away since the round began is not this node's to purge
    if table != STATE_TABLE && !targets(function)?.iter().any(|t| t == table) {
        return Ok(Span {
            deleted: 0,
            next: None,
        });
    }
    let now_us = clock::table_now_us();
    let now = timestamptz(function, now_us)?;
    let idle_since = timestamptz(function, now_us.saturating_sub(idle_us.max(0)))?;
    let statement = span_statement(table, after.is_some());
    Spi::connect_mut(|client| {
        let mut args: Vec<DatumWithOid<'_>> = vec![now.into(), rows.into(), idle_since.into()];
        if let Some(p) = after {
            args.push(p.namespace.as_str().into());
            args.push(p.key.as_str().into());
        }
        let result = spi(function, client.update(&statement, None, &args))?;
        let Some(row) = result.into_iter().next() else {
            return Ok(Span {
                deleted: 0,
                next: None,
            });
        };
        let deleted = spi(function, row.get::<i64>(1))?.unwrap_or(0);
        let read = spi(function, row.get::<i64>(2))?.unwrap_or(0);
        let namespace = spi(function, row.get::<String>(3))?;
        let key = spi(function, row.get::<String>(4))?;
        let next = match (namespace, key) {
            (Some(namespace), Some(key)) if read >= rows => Some(Position { namespace, key }),
            _ => None,
        };
        Ok(Span { deleted, next })
    })
}
