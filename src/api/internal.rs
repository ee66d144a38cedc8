//! Helpers that the extension's own statements and views use: the row arithmetic of the table store and the
//! listing of the memory store. Not public API: PUBLIC cannot execute them (`sql/finalize.sql`), and bad
//! numbers give 22023 like every other argument error.

use pgrx::datum::{AnyNumeric, Interval, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::Spi;

use crate::algorithm::{Algorithm, Policy, State};
use crate::error;
use crate::store::memory;
use crate::store::target::Stored;

/// A stored row's numbers as a policy; 22023 when they do not make one.
fn row_policy(
    function: &'static str,
    algorithm: &str,
    rate: i64,
    per_us: i64,
    burst: i64,
) -> Result<Policy, ErrorReport> {
    let algorithm = Algorithm::parse(algorithm).ok_or_else(|| {
        error::invalid_numbers(function, &format!("unknown algorithm '{algorithm}'"))
    })?;
    Policy::new(algorithm, rate, per_us, burst)
        .map_err(|e| error::invalid_numbers(function, &e.to_string()))
}

fn stored_row(
    function: &'static str,
    level: i64,
    updated_at: TimestampWithTimeZone,
    algorithm: &str,
    rate: i64,
    per_us: i64,
    burst: i64,
) -> Result<Stored, ErrorReport> {
    Ok(Stored {
        state: State {
            level,
            at: updated_at.into_inner(),
        },
        policy: row_policy(function, algorithm, rate, per_us, burst)?,
    })
}

/// Internal helpers, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// The level after taking `cost` tokens at `now` from a stored `rate_limit.bucket_state` row, carried
    /// over to the numbers of the call (`new_*`, in effect since `changed_at`), or -1 if there are not
    /// enough: the arithmetic inside the table store's conditional UPDATE. Volatile: it reads the clock to
    /// tell concurrency skew from a clock step (`crate::clock::effective_now`).
    #[allow(clippy::too_many_arguments)] // a stored row, the call's numbers and the instant, as SQL passes them
    #[pg_extern(volatile, parallel_safe, strict)]
    fn state_after_take(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        new_algorithm: &str,
        new_rate: i64,
        new_per_us: i64,
        new_burst: i64,
        changed_at: TimestampWithTimeZone,
        now: TimestampWithTimeZone,
        cost: i64,
    ) -> Result<i64, ErrorReport> {
        const F: &str = "rate_limit.state_after_take";
        let stored = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        let current = row_policy(F, new_algorithm, new_rate, new_per_us, new_burst)?;
        if cost < 0 {
            return Err(error::out_of_range(F, "cost", cost, 0, i64::MAX));
        }
        Ok(crate::store::table::state_after_take(
            stored,
            current,
            changed_at.into_inner(),
            now.into_inner(),
            cost,
        ))
    }

    /// The instant a row stored at `updated_at` is evaluated at by a call that read the clock at `now`
    /// (see `crate::clock::effective_now`): the row's new `updated_at` after a grant, the very instant the
    /// arithmetic of the same `TAKE` used (`crate::store::table::instant_of_take`).
    #[pg_extern(volatile, parallel_safe, strict)]
    fn effective_now(
        now: TimestampWithTimeZone,
        updated_at: TimestampWithTimeZone,
    ) -> Result<TimestampWithTimeZone, ErrorReport> {
        let at = crate::store::table::instant_of_take(now.into_inner(), updated_at.into_inner());
        TimestampWithTimeZone::try_from(at).map_err(|_| {
            error::invalid_numbers("rate_limit.effective_now", "the instant is out of range")
        })
    }

    /// Tokens in a stored `rate_limit.bucket_state` row at `at`, exact to the millionth (rounded down).
    #[pg_extern(stable, parallel_safe, strict)]
    fn state_tokens(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        at: TimestampWithTimeZone,
    ) -> Result<AnyNumeric, ErrorReport> {
        const F: &str = "rate_limit.state_tokens";
        let s = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        error::millionths_numeric(F, s.policy.tokens_millionths(s.state, at.into_inner()))
    }

    /// Whether a stored `rate_limit.bucket_state` row is full at `at` (and so may be deleted losslessly).
    #[pg_extern(stable, parallel_safe, strict)]
    fn state_is_full(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        at: TimestampWithTimeZone,
    ) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.state_is_full";
        let s = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        Ok(s.policy.is_full(s.state, at.into_inner()))
    }

    /// Buckets of the memory store in this database (none when the library is not preloaded), for the
    /// `rate_limit.buckets` view. Buckets of a dropped policy are not listed (they wait to be purged).
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
        let listed = memory::list();
        let mut names = std::collections::HashMap::new();
        if listed.iter().any(|l| l.kind == "policy") {
            Spi::connect(|client| {
                for row in client.select(
                    "SELECT name, created_at FROM rate_limit.policies",
                    None,
                    &[],
                )? {
                    let name: Option<String> = row.get(1)?;
                    let created: Option<TimestampWithTimeZone> = row.get(2)?;
                    if let (Some(name), Some(created)) = (name, created) {
                        names.insert(memory::policy_tag(&name, created.into_inner()), name);
                    }
                }
                Ok::<_, pgrx::spi::SpiError>(())
            })
            .map_err(|e| error::internal(F, e))?;
        }
        let mut rows = Vec::with_capacity(listed.len());
        for l in listed {
            let policy = if l.kind == "policy" {
                match names.get(&l.policy_tag) {
                    Some(n) => Some(n.clone()),
                    None => continue, // a dropped policy's bucket, waiting to be purged
                }
            } else {
                None
            };
            rows.push((
                l.kind.to_string(),
                policy,
                l.key,
                error::millionths_numeric(F, l.millionths)?,
                l.policy.burst(),
                l.policy.rate(),
                Some(Interval::from_micros(l.policy.period_us())),
                l.policy.algorithm().name().to_string(),
                TimestampWithTimeZone::try_from(l.updated_at).ok(),
            ));
        }
        Ok(TableIterator::new(rows))
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
            ),
        >,
        ErrorReport,
    > {
        let u = memory::usage("rate_limit.memory_usage")?;
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
        )))
    }

    /// The buckets each database holds in the memory store, for operators: every database that holds
    /// any, with its name (NULL once dropped, until the background worker frees its buckets). Owner only.
    #[pg_extern(volatile, parallel_unsafe)]
    fn memory_shares() -> Result<
        TableIterator<'static, (name!(database, Option<String>), name!(buckets, i64))>,
        ErrorReport,
    > {
        const F: &str = "rate_limit.memory_shares";
        let mut rows = Vec::new();
        for (oid, buckets) in memory::shares(F)? {
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
