//! The `rate_limit.decision` record: combining the outcomes of one call's buckets, and building the SQL
//! value.

use std::cell::Cell;

use pgrx::datum::Interval;
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self};
use pgrx::spi::Spi;
use pgrx::{AllocatedByRust, IntoDatum, PgSqlErrorCode, PgTupleDesc};

use crate::algorithm::Outcome;
use crate::error;

/// What a call decided, as `rate_limit.decision` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether every bucket granted.
    pub allowed: bool,
    /// Whole tokens left in the reported bucket (never negative).
    pub remaining: i64,
    /// The reported bucket's capacity.
    pub limit: i64,
    /// Microseconds until the call could be granted; `None` when allowed or never possible.
    pub retry_after: Option<i64>,
    /// Microseconds until the reported bucket is full.
    pub reset_after: i64,
    /// The reported policy (`None` for ad-hoc limits).
    pub policy: Option<String>,
}

impl Decision {
    /// Combines the outcomes of one call's buckets (`names[i]` is the policy of `outcomes[i]`, `None` for
    /// ad-hoc and request buckets; `limits[i]` its capacity). Allowed: every bucket granted; the reported bucket is the one with
    /// the fewest tokens left. Denied: the reported bucket is the denying one with the longest wait (a
    /// bucket that can never grant counts as the longest), and `retry_after` is that wait: by then every
    /// other bucket grants too, since tokens only accumulate while nobody takes.
    pub fn combine(names: &[Option<&str>], limits: &[i64], outcomes: &[Outcome]) -> Decision {
        let allowed = outcomes.iter().all(|o| o.allowed);
        let pick = if allowed {
            (0..outcomes.len()).min_by_key(|&i| outcomes[i].remaining)
        } else {
            (0..outcomes.len())
                .filter(|&i| !outcomes[i].allowed)
                .max_by_key(|&i| outcomes[i].retry_after.unwrap_or(i64::MAX))
        }
        .unwrap_or(0);
        let o = &outcomes[pick];
        Decision {
            allowed,
            remaining: o.remaining.max(0),
            limit: limits[pick],
            retry_after: if allowed { None } else { o.retry_after },
            reset_after: o.reset_after,
            policy: names[pick].map(str::to_string),
        }
    }
}

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
    let (oid, rel) = Spi::get_two::<pg_sys::Oid, pg_sys::Oid>(
        "SELECT oid, typrelid FROM pg_catalog.pg_type \
         WHERE oid OPERATOR(pg_catalog.=) 'rate_limit.decision'::pg_catalog.regtype",
    )
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
    ];
    // SAFETY: the datums match the type's columns (boolean, bigint, bigint, interval, interval, text),
    // as created by sql/bootstrap.sql.
    unsafe { PgHeapTuple::from_datums(desc, datums) }.map_err(|e| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("rate_limit internal error: {e}"),
            function,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::State;

    fn outcome(allowed: bool, remaining: i64, retry: Option<i64>, reset: i64) -> Outcome {
        Outcome {
            allowed,
            state: State { level: 0, at: 0 },
            remaining,
            retry_after: retry,
            reset_after: reset,
        }
    }

    #[test]
    fn allowed_reports_the_tightest_bucket() {
        let d = Decision::combine(
            &[Some("user"), Some("org")],
            &[10, 100],
            &[outcome(true, 7, None, 3), outcome(true, 2, None, 9)],
        );
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 2,
                limit: 100,
                retry_after: None,
                reset_after: 9,
                policy: Some("org".into())
            }
        );
    }

    #[test]
    fn denied_reports_the_longest_wait() {
        let d = Decision::combine(
            &[Some("a"), Some("b"), Some("c")],
            &[1, 2, 3],
            &[
                outcome(false, 0, Some(5), 5),
                outcome(true, 1, None, 1),
                outcome(false, 0, Some(8), 8),
            ],
        );
        assert_eq!(
            (d.allowed, d.retry_after, d.policy.as_deref(), d.limit),
            (false, Some(8), Some("c"), 3)
        );
        let never = Decision::combine(
            &[Some("a"), None],
            &[1, 2],
            &[outcome(false, 0, Some(5), 5), outcome(false, 2, None, 0)],
        );
        assert_eq!((never.retry_after, never.policy), (None, None));
    }
}
