//! The SQL-facing functions: validate the arguments, call the store, shape the result.

use pgrx::datum::{AnyNumeric, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::bucket::{Bucket, Limit};
use crate::error::{self, MAX_ID_BYTES};
use crate::gucs::{self, Store};
use crate::store::memory;
use crate::store::table::{self, Request};

/// The largest capacity whose remaining count (`capacity - 1`) fits in the `int` a request returns.
const MAX_CAPACITY: i64 = i32::MAX as i64 + 1;

fn id_arg<'a>(function: &'static str, id: Option<&'a str>) -> Result<&'a str, ErrorReport> {
    let id = id.ok_or_else(|| {
        error::null_argument(
            function,
            "id",
            "Pass the key to limit, such as a user id, an API key or an IP address.",
        )
    })?;
    if id.len() > MAX_ID_BYTES {
        return Err(error::id_too_long(function, id.len()));
    }
    Ok(id)
}

fn positive_int_arg(
    function: &'static str,
    name: &str,
    value: Option<i32>,
    default: i32,
) -> Result<i64, ErrorReport> {
    let value = value.ok_or_else(|| {
        error::null_argument(
            function,
            name,
            &format!(
                "Pass a whole number from 1 to {}, or omit {name} for its default of {default}.",
                i32::MAX
            ),
        )
    })?;
    if value < 1 {
        return Err(error::out_of_range(
            function,
            name,
            value.into(),
            1,
            i32::MAX.into(),
        ));
    }
    Ok(value.into())
}

/// The level (millionths of a token) of bucket `id` now in the selected store, and the validated limit.
fn level_now(
    function: &'static str,
    id: Option<&str>,
    refill_per_sec: Option<i32>,
    window_seconds: Option<i32>,
) -> Result<(i64, Limit), ErrorReport> {
    let id = id_arg(function, id)?;
    let limit = per_second_limit(function, refill_per_sec, window_seconds)?;
    let level = match gucs::store() {
        Store::Table => table::level_now(function, id, &limit)?,
        Store::Memory => memory::level_now(function, id, &limit)?,
    };
    Ok((level, limit))
}

/// The limit of `rate_limiting_request(id, refill_per_sec, window_seconds)`, validated.
fn per_second_limit(
    function: &'static str,
    refill_per_sec: Option<i32>,
    window_seconds: Option<i32>,
) -> Result<Limit, ErrorReport> {
    let refill = positive_int_arg(function, "refill_per_sec", refill_per_sec, 2)?;
    let window = positive_int_arg(function, "window_seconds", window_seconds, 60)?;
    // Both are at most i32::MAX, so the product fits in i64.
    let capacity = refill * window;
    if capacity > MAX_CAPACITY {
        return Err(error::capacity_too_large(
            function,
            capacity.into(),
            MAX_CAPACITY,
        ));
    }
    Limit::per_second(refill, window)
        .map_err(|e| error::out_of_range_limit(function, &e.to_string()))
}

/// Takes one token from the bucket `id`, refilled at `refill_per_sec` tokens per second up to
/// `refill_per_sec × window_seconds` tokens; returns the whole tokens left, or -1 when denied.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn rate_limiting_request(
    id: Option<&str>,
    refill_per_sec: default!(Option<i32>, 2),
    window_seconds: default!(Option<i32>, 60),
) -> Result<i32, ErrorReport> {
    const FUNCTION: &str = "rate_limiting_request";
    let id = id_arg(FUNCTION, id)?;
    let limit = per_second_limit(FUNCTION, refill_per_sec, window_seconds)?;
    let taken = match gucs::store() {
        Store::Table => table::take(&Request {
            function: FUNCTION,
            id,
            limit,
            cost: 1,
        })?,
        Store::Memory => memory::take(FUNCTION, id, &limit, 1)?,
    };
    match taken {
        // remaining <= capacity - 1 <= i32::MAX, checked by per_second_limit
        Some(remaining) => Ok(i32::try_from(remaining).unwrap_or(i32::MAX)),
        None => Ok(-1),
    }
}

/// The management functions, in schema `rate_limit` (created by `sql/bootstrap.sql`).
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Whole tokens in the bucket `id` now under the given limit, taking none and writing nothing.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn peek(
        id: Option<&str>,
        refill_per_sec: default!(Option<i32>, 2),
        window_seconds: default!(Option<i32>, 60),
    ) -> Result<i64, ErrorReport> {
        let (level, limit) = level_now("rate_limit.peek", id, refill_per_sec, window_seconds)?;
        Ok(level / limit.ticks_per_token())
    }

    /// Tokens in the bucket `id` now under the given limit, exact to the millionth; takes none.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn tokens(
        id: Option<&str>,
        refill_per_sec: default!(Option<i32>, 2),
        window_seconds: default!(Option<i32>, 60),
    ) -> Result<AnyNumeric, ErrorReport> {
        const FUNCTION: &str = "rate_limit.tokens";
        let (level, _) = level_now(FUNCTION, id, refill_per_sec, window_seconds)?;
        error::millionths_numeric(FUNCTION, level)
    }

    /// Deletes the bucket `id`, which makes it full again; true if it existed.
    #[pg_extern(
        volatile,
        parallel_unsafe,
        security_definer,
        schema = "rate_limit",
        name = "reset"
    )]
    #[search_path(pg_catalog, pg_temp)]
    fn rate_limit_reset(id: Option<&str>) -> Result<bool, ErrorReport> {
        const FUNCTION: &str = "rate_limit.reset";
        let id = id_arg(FUNCTION, id)?;
        match gucs::store() {
            Store::Table => table::reset(FUNCTION, id),
            Store::Memory => memory::reset(FUNCTION, id),
        }
    }

    /// Deletes every bucket that is full now (losslessly: a missing bucket is a full one); returns how many.
    #[pg_extern(
        volatile,
        parallel_unsafe,
        security_definer,
        schema = "rate_limit",
        name = "purge"
    )]
    #[search_path(pg_catalog, pg_temp)]
    fn rate_limit_purge() -> Result<i64, ErrorReport> {
        const FUNCTION: &str = "rate_limit.purge";
        match gucs::store() {
            Store::Table => table::purge(FUNCTION),
            Store::Memory => memory::purge(FUNCTION),
        }
    }

    /// The level in ticks (millionths of a token) at `at` of a stored bucket row: the arithmetic behind the
    /// `rate_limit.buckets` view and `purge()`.
    #[pg_extern(immutable, parallel_safe, strict)]
    fn bucket_level_at(
        level: i64,
        updated_at: TimestampWithTimeZone,
        refill_per_sec: i32,
        capacity: i64,
        at: TimestampWithTimeZone,
    ) -> Result<i64, ErrorReport> {
        let (bucket, limit) = stored_row(
            "rate_limit.bucket_level_at",
            level,
            updated_at,
            refill_per_sec,
            capacity,
        )?;
        Ok(bucket.level_at(&limit, at.into_inner()))
    }

    /// The level (millionths of a token) after taking `cost` tokens at `at` from a stored bucket row under
    /// the limit `refill_per_sec` / `capacity`, or -1 if there are not enough: the arithmetic inside the
    /// table store's conditional UPDATE.
    #[pg_extern(immutable, parallel_safe, strict)]
    fn level_after_take(
        level: i64,
        updated_at: TimestampWithTimeZone,
        refill_per_sec: i32,
        capacity: i64,
        at: TimestampWithTimeZone,
        cost: i64,
    ) -> Result<i64, ErrorReport> {
        let (bucket, limit) = stored_row(
            "rate_limit.level_after_take",
            level,
            updated_at,
            refill_per_sec,
            capacity,
        )?;
        Ok(match bucket.take(&limit, at.into_inner(), cost) {
            crate::bucket::Take::Granted { bucket, .. } => bucket.level,
            crate::bucket::Take::Denied { .. } => -1,
        })
    }

    /// A stored row of `rate_limit.bucket_state` as a bucket and the limit it was last granted under.
    fn stored_row(
        function: &'static str,
        level: i64,
        updated_at: TimestampWithTimeZone,
        refill_per_sec: i32,
        capacity: i64,
    ) -> Result<(Bucket, Limit), ErrorReport> {
        let limit = Limit::new(
            refill_per_sec.into(),
            crate::bucket::MICROS_PER_SECOND,
            capacity,
        )
        .map_err(|e| error::out_of_range_limit(function, &e.to_string()))?;
        let bucket = Bucket {
            level,
            updated_at: updated_at.into_inner(),
        };
        Ok((bucket, limit))
    }

    /// Buckets of the memory store (none when the library is not preloaded), for `rate_limit.buckets`.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn memory_buckets() -> TableIterator<
        'static,
        (
            name!(id, String),
            name!(level, i64),
            name!(capacity, i64),
            name!(refill_per_sec, i32),
            name!(updated_at, Option<TimestampWithTimeZone>),
        ),
    > {
        TableIterator::new(memory::list().into_iter().map(|b| {
            (
                b.id,
                b.level,
                b.capacity,
                b.refill_per_sec,
                TimestampWithTimeZone::try_from(b.updated_at).ok(),
            )
        }))
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
        )))
    }
}
