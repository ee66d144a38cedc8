//! Where bucket state lives: one interface over the buckets of a call (take, peek, refund, reset, purge,
//! list) with two implementations, [`table`] and [`memory`]. A store loads, locks and saves state; the
//! arithmetic is `crate::algorithm`'s, evaluated through [`target::Target`].
//!
//! The fast path that needs no store at all lives here, so that every call gets it: a bucket this backend
//! saw short is denied from the backend's own memory ([`short`]), with exact figures computed from the
//! remembered state.

pub mod memory;
pub mod short;
pub mod table;

pub use rate_limit_model::target;

use pgrx::pg_sys::panic::ErrorReport;

use crate::algorithm::{Outcome, State};
use crate::clock;
use crate::gucs::Store;
use crate::stats;
use target::{Namespace, Target};

/// Now on the clock of `store`: the wall clock for the table store, the memory store's own clock (55000
/// when it is not available).
fn now(function: &'static str, store: Store) -> Result<i64, ErrorReport> {
    match store {
        Store::Table => Ok(clock::now_us()),
        Store::Memory => memory::now(function),
    }
}

/// Asks every target for `cost` tokens, all or nothing (cost 0 only reports); returns one outcome per
/// target. When a call is denied, at least one outcome is denied and nothing was taken; outcomes of buckets
/// the call did not need to look at are reported as allowed.
pub fn take(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<Vec<Outcome>, ErrorReport> {
    if cost > 0 {
        let now = now(function, store)?;
        for (i, t) in targets.iter().enumerate() {
            if let Some(denied) = short::denial(store, t, now, cost) {
                let mut outcomes = vec![not_looked_at(); targets.len()];
                outcomes[i] = denied;
                stats::record(targets, &outcomes, cost);
                return Ok(outcomes);
            }
        }
    }
    let outcomes = match store {
        Store::Table => table::take(function, targets, cost)?,
        Store::Memory => memory::take(function, targets, cost)?,
    };
    if cost > 0 {
        for (t, o) in targets.iter().zip(&outcomes) {
            if !o.allowed {
                short::remember(store, t, o.state);
            }
        }
        stats::record(targets, &outcomes, cost);
    }
    Ok(outcomes)
}

/// The outcome reported for a bucket a denied call did not look at.
fn not_looked_at() -> Outcome {
    Outcome {
        allowed: true,
        state: State { level: 0, at: 0 },
        remaining: 0,
        retry_after: None,
        reset_after: 0,
    }
}

/// Puts up to `tokens` back into the bucket of `target` (never above its capacity); returns the bucket.
pub fn refund(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    tokens: i64,
) -> Result<Outcome, ErrorReport> {
    short::forget(&target.namespace, target.key);
    match store {
        Store::Table => table::refund(function, target, tokens),
        Store::Memory => memory::refund(function, target, tokens),
    }
}

/// Deletes the bucket (it is full again); true if it existed.
pub fn reset(
    function: &'static str,
    store: Store,
    namespace: &Namespace<'_>,
    key: &str,
) -> Result<bool, ErrorReport> {
    short::forget(namespace, key);
    match store {
        Store::Table => table::reset(function, namespace, key),
        Store::Memory => memory::reset(function, namespace, key),
    }
}

/// Deletes every bucket that is full now from both stores (the memory store when it is available),
/// losslessly; returns how many.
pub fn purge(function: &'static str) -> Result<i64, ErrorReport> {
    let mut purged = table::purge(function)?;
    if memory::available() {
        purged += memory::purge(function, memory::PurgeScope::CurrentDatabase)?;
    }
    Ok(purged)
}
