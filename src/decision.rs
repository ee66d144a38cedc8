//! The `rate_limit.decision` SQL value, built from the model's [`Decision`] (which combines the outcomes of
//! one call's buckets).

use std::cell::Cell;

use pgrx::datum::Interval;
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self};
use pgrx::spi::Spi;
use pgrx::{AllocatedByRust, IntoDatum, PgSqlErrorCode, PgTupleDesc};

use crate::error;

pub use rate_limit_model::decision::{Decision, Reported};

/// `rate_limit.decision` as this backend knows it.
#[derive(Clone, Copy)]
struct DecisionType {
    /// Its relation (`typrelid`): an invalidation of it means the type changed or went away.
    relation: pg_sys::Oid,
    /// A copy of its tuple descriptor in `TopMemoryContext`, made once per backend (and again after an
    /// invalidation), so that a call builds its result without a type-cache lookup and a copy.
    desc: pg_sys::TupleDesc,
}

thread_local! {
    /// Resolved on first use; cleared when the type's relation is invalidated (DROP EXTENSION, ALTER TYPE).
    static TYPE: Cell<Option<DecisionType>> = const { Cell::new(None) };
}

/// Forgets the type if `relid` is its relation (or everything is being invalidated). The old descriptor
/// copy is left in `TopMemoryContext` (a few hundred bytes, once per change of the type): an invalidation
/// can arrive while a call still holds it.
pub fn forget_type_if(relid: pg_sys::Oid) {
    TYPE.with(|t| {
        if let Some(known) = t.get() {
            if relid == pg_sys::InvalidOid || relid == known.relation {
                t.set(None);
            }
        }
    });
}

/// The tuple descriptor of `rate_limit.decision`, from this backend's copy.
fn decision_desc(function: &'static str) -> Result<pg_sys::TupleDesc, ErrorReport> {
    if let Some(known) = TYPE.with(Cell::get) {
        return Ok(known.desc);
    }
    // a read-only query (Spi::get_two would run it as an update, which takes a transaction id: refused on
    // a hot standby, where the memory store grants)
    let (oid, rel) = Spi::connect(|client| {
        let row = client
            .select(
                "SELECT oid, typrelid FROM pg_catalog.pg_type \
                 WHERE oid OPERATOR(pg_catalog.=) 'rate_limit.decision'::pg_catalog.regtype",
                Some(1),
                &[],
            )?
            .first();
        Ok::<_, pgrx::spi::SpiError>((row.get::<pg_sys::Oid>(1)?, row.get::<pg_sys::Oid>(2)?))
    })
    .map_err(|e| error::internal(function, e))?;
    let (Some(oid), Some(rel)) = (oid, rel) else {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            "type rate_limit.decision does not exist",
            function,
        ));
    };
    // SAFETY: the type exists (just resolved); lookup_rowtype_tupdesc_copy returns a fresh, unshared copy,
    // allocated in TopMemoryContext so that it lives as long as the backend.
    let desc = unsafe {
        let old = pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
        let desc = pg_sys::lookup_rowtype_tupdesc_copy(oid, -1);
        pg_sys::MemoryContextSwitchTo(old);
        desc
    };
    TYPE.with(|t| {
        t.set(Some(DecisionType {
            relation: rel,
            desc,
        }))
    });
    Ok(desc)
}

/// Microseconds as an interval (all in the time field: `'00:00:06'`). `None` cannot happen: with months
/// and days 0 the signs cannot mismatch.
pub fn interval(us: i64) -> Option<Interval> {
    Interval::new(0, 0, us).ok()
}

/// The decision as a `rate_limit.decision` value.
pub fn to_sql(
    function: &'static str,
    d: &Decision,
) -> Result<PgHeapTuple<'static, AllocatedByRust>, ErrorReport> {
    // SAFETY: the descriptor is this backend's own copy (never reference-counted nor freed), valid until
    // the type changes; from_pg_unchecked neither releases nor frees it.
    let desc = unsafe { PgTupleDesc::from_pg_unchecked(decision_desc(function)?) };
    let datums = [
        d.allowed.into_datum(),
        d.remaining.into_datum(),
        d.limit.into_datum(),
        d.retry_after.and_then(interval).into_datum(),
        interval(d.reset_after).into_datum(),
        d.policy.as_deref().into_datum(),
        d.shadow_denied.into_datum(),
        d.lease.into_datum(),
    ];
    // SAFETY: the datums match the type's columns (boolean, bigint, bigint, interval, interval, text,
    // boolean, bigint), as created by sql/bootstrap.sql.
    unsafe { PgHeapTuple::from_datums(desc, datums) }.map_err(|e| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("rate_limit internal error: {e}"),
            function,
        )
    })
}
