//! Helpers that the extension's own views use, and the memory store's reports: thin SQL wrappers over
//! `crate::store`. `memory_buckets` and `memory_shares` are not executable by PUBLIC
//! (`sql/finalize.sql`). The table store's SQL-side helpers live beside it (`store/table/sql.rs`).

use pgrx::datum::{AnyNumeric, Interval, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::cluster::merged::{self, MemoryBucketRow};
use crate::error;
use crate::store;

/// This node's memory buckets in the current database.
fn node_memory_buckets(function: &'static str) -> Result<Vec<MemoryBucketRow>, ErrorReport> {
    let listed = store::memory_buckets(function)?;
    let mut rows = Vec::with_capacity(listed.len());
    for l in listed {
        rows.push((
            l.kind.name().to_string(),
            l.policy,
            l.key,
            error::millionths_numeric(function, l.millionths)?,
            l.numbers.burst(),
            l.numbers.rate(),
            Some(Interval::from_micros(l.numbers.period_us())),
            l.numbers.algorithm().name().to_string(),
            TimestampWithTimeZone::try_from(l.updated_at).ok(),
        ));
    }
    Ok(rows)
}

/// Internal helpers, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Buckets of the memory store in this database (none when the library is not preloaded), for the
    /// `rate_limit.buckets` view: this node's, or on a Citus coordinator of a distributed database every
    /// node's. Buckets of a dropped policy are not listed (they wait to be freed).
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn memory_buckets() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(key, String),
                name!(tokens, AnyNumeric),
                name!(limit, i64),
                name!(rate, i64),
                name!(per, Option<Interval>),
                name!(algorithm, String),
                name!(updated_at, Option<TimestampWithTimeZone>),
            ),
        >,
        ErrorReport,
    > {
        const F: &str = "rate_limit.memory_buckets";
        match merged::memory_buckets(F)? {
            Some(rows) => Ok(TableIterator::new(rows)),
            None => node_memory_buckets(F).map(TableIterator::new),
        }
    }

    /// This node's own rows of `memory_buckets`, also on a Citus coordinator.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(
        volatile,
        parallel_unsafe,
        security_definer,
        name = "node_memory_buckets"
    )]
    fn node_memory_buckets_rows() -> Result<
        TableIterator<
            'static,
            (
                name!(kind, String),
                name!(policy, Option<String>),
                name!(key, String),
                name!(tokens, AnyNumeric),
                name!(limit, i64),
                name!(rate, i64),
                name!(per, Option<Interval>),
                name!(algorithm, String),
                name!(updated_at, Option<TimestampWithTimeZone>),
            ),
        >,
        ErrorReport,
    > {
        node_memory_buckets("rate_limit.node_memory_buckets").map(TableIterator::new)
    }

    /// Size and use of the memory store; 55000 when the library is not preloaded.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn memory_usage() -> Result<
        TableIterator<
            'static,
            (
                name!(max_buckets, i64),
                name!(buckets, i64),
                name!(partitions, i64),
                name!(slots, i64),
                name!(slot_bytes, i64),
                name!(total_bytes, i64),
                name!(bytes_per_bucket, i64),
                name!(lossless_evictions, i64),
                name!(lossy_evictions, i64),
                name!(refused_full, i64),
                name!(share_percent, i64),
                name!(share_buckets, i64),
                name!(database_buckets, i64),
                name!(role_share_percent, i64),
                name!(role_share_buckets, i64),
                name!(role_buckets, i64),
            ),
        >,
        ErrorReport,
    > {
        let u = store::memory_usage("rate_limit.memory_usage")?;
        Ok(TableIterator::once((
            u.max_buckets,
            u.buckets,
            u.partitions,
            u.slots,
            u.slot_bytes,
            u.total_bytes,
            u.bytes_per_bucket,
            u.lossless_evictions,
            u.lossy_evictions,
            u.refused_full,
            u.share_percent,
            u.share_buckets,
            u.database_buckets,
            u.role_share_percent,
            u.role_share_buckets,
            u.role_buckets,
        )))
    }

    /// The buckets each database holds in the memory store, for operators: every database that holds
    /// any, with its name (NULL once dropped, until the background worker frees its buckets). Owner only.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe)]
    fn memory_shares() -> Result<
        TableIterator<'static, (name!(database, Option<String>), name!(buckets, i64))>,
        ErrorReport,
    > {
        const F: &str = "rate_limit.memory_shares";
        let mut rows = Vec::new();
        for (oid, buckets) in store::memory_shares(F)? {
            // SAFETY: get_database_name reads the syscache inside this function's transaction and returns
            // a palloc'd copy (or NULL for an OID that names no database).
            let name = unsafe {
                let p = pg_sys::get_database_name(pg_sys::Oid::from(oid));
                (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
            };
            rows.push((name, buckets));
        }
        Ok(TableIterator::new(rows))
    }
}
