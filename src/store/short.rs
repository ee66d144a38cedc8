//! Per-backend memory of buckets seen short, so that a flood of calls on a drained bucket is denied without
//! touching the table or the shared hash table at all, for every call of one bucket
//! (`rate_limiting_request`, a policy's, an ad-hoc limit's, each key of a batch). A multi-limit call is
//! remembered per bucket but always asks the store: its denial reports the longest wait of its buckets,
//! which only the store knows.
//!
//! What is remembered is the bucket's state (under the numbers of the call that saw it) at the instant of
//! the denial. A later call with the same numbers evaluates that state at its own time and cost: if the
//! remembered state denies, the call is denied from memory, with `remaining` / `retry_after` /
//! `reset_after` computed exactly from the remembered state; otherwise the entry is dropped and the store
//! decides.
//!
//! Soundness: between the denial and now, other sessions can only have removed tokens from the bucket, so
//! if the remembered state cannot grant, the real one cannot either. The exceptions add tokens:
//! - this backend's own transaction rolling back (a denial it saw may have counted its own uncommitted
//!   take): the memory is cleared at every (sub)transaction abort;
//! - `reset` / `refund` in this backend: the bucket is forgotten (and so is a bucket this backend takes or
//!   charges tokens from by any path: the remembered figures would then say it holds more than it does);
//! - `reset`, `refund` or a lossy eviction in another backend: seen once the remembered state would grant
//!   again, at most the time the call's cost takes to refill (documented);
//! - a policy change: the numbers no longer match, so the entry is not used;
//! - the clock stepping back behind the remembered instant, or behind the instant the numbers changed: the
//!   entry is not used (the store rebases, and carries over at the change's instant).
//!
//! The memory holds at most [`CAPACITY`] buckets and is emptied when full.

use std::cell::RefCell;
use std::collections::HashMap;

use rate_limit_model::pipeline::Remembered;

use crate::gucs::Store;
use rate_limit_model::algorithm::{Outcome, State};
use rate_limit_model::target::{Namespace, Target};

/// Buckets remembered at most per backend.
pub const CAPACITY: usize = 4096;

thread_local! {
    static SHORT: RefCell<HashMap<Vec<u8>, Remembered>> = RefCell::new(HashMap::new());
    /// The buffer map keys are built in, so that a lookup allocates nothing.
    static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with the map key of a bucket: store, namespace, key and the policy's creation time, separated
/// by a byte that text cannot contain.
fn with_key<R>(
    store: Store,
    namespace: &Namespace<'_>,
    key: &str,
    f: impl FnOnce(&[u8]) -> R,
) -> R {
    KEY.with(|buffer| {
        let mut k = buffer.borrow_mut();
        k.clear();
        k.push(if store == Store::Memory { b'm' } else { b't' });
        k.extend_from_slice(namespace.stored_name().as_bytes());
        k.push(0);
        k.extend_from_slice(key.as_bytes());
        k.push(0);
        k.extend_from_slice(&namespace.created_at().to_le_bytes());
        f(&k)
    })
}

/// [`denial`] as the model's pipeline asks for it (its `remembered_short`): the denial this backend
/// remembers for a target, never an error.
pub fn remembered<E>(store: Store) -> impl Fn(&Target<'_>, i64, i64) -> Result<Option<Outcome>, E> {
    move |target, now, cost| Ok(denial(store, target, now, cost))
}

/// The denial of `cost` tokens at `now`, if this backend remembers the bucket as too short for it.
pub fn denial(store: Store, target: &Target<'_>, now: i64, cost: i64) -> Option<Outcome> {
    if cost < 1 {
        return None;
    }
    with_key(store, &target.namespace, target.key, |key| {
        SHORT.with(|m| {
            let mut m = m.borrow_mut();
            let denied = m.get(key)?.denial(target, now, cost);
            if denied.is_none() {
                m.remove(key);
            }
            denied
        })
    })
}

/// Remembers that the bucket of `target` was short, in state `state` (under `target`'s numbers).
pub fn remember(store: Store, target: &Target<'_>, state: State) {
    with_key(store, &target.namespace, target.key, |key| {
        SHORT.with(|m| {
            let mut m = m.borrow_mut();
            if m.len() >= CAPACITY && !m.contains_key(key) {
                m.clear();
            }
            m.insert(key.to_vec(), Remembered::of(target, state));
        })
    });
}

/// Forgets a bucket in both stores (after a reset or refund in this backend).
pub fn forget(namespace: &Namespace<'_>, key: &str) {
    for store in [Store::Table, Store::Memory] {
        with_key(store, namespace, key, |k| {
            SHORT.with(|m| m.borrow_mut().remove(k))
        });
    }
}

/// Forgets a bucket this backend has just taken tokens from (or charged): what it remembered of it holds
/// more tokens than the bucket now does, and would report them (a denial is still right, its figures
/// not). Costs one check when nothing is remembered, the common case.
pub fn forget_taken(namespace: &Namespace<'_>, key: &str) {
    if SHORT.with(|m| m.borrow().is_empty()) {
        return;
    }
    forget(namespace, key);
}

/// Forgets everything (at transaction abort: a rolled-back take may have been refunded).
pub fn forget_all() {
    SHORT.with(|m| m.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use super::*;
    use rate_limit_model::algorithm::{Algorithm, Policy};

    const S: i64 = 1_000_000;

    fn target(key: &str, rate: i64) -> Target<'_> {
        Target {
            namespace: Namespace::Request,
            key,
            policy: Policy::new(Algorithm::TokenBucket, rate, S, 10).unwrap(),
            changed_at: i64::MIN,
            shadow: false,
            blocking: None,
            verdict: None,
        }
    }

    #[test]
    fn denies_from_the_remembered_state_with_exact_figures_until_it_would_grant() {
        forget_all();
        let t = target("a", 2);
        // empty at 0: a token after 500 ms
        remember(Store::Table, &t, State { level: 0, at: 0 });
        let d = denial(Store::Table, &t, 100_000, 1).expect("still short");
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after),
            (false, 0, Some(400_000))
        );
        assert_eq!(d.reset_after, 5 * S - 100_000);
        assert!(
            denial(Store::Memory, &t, 100_000, 1).is_none(),
            "the other store's bucket"
        );
        assert!(denial(Store::Table, &target("b", 2), 100_000, 1).is_none());
        assert!(
            denial(Store::Table, &target("a", 3), 100_000, 1).is_none(),
            "other numbers"
        );
        assert!(
            denial(Store::Table, &t, 500_000, 1).is_none(),
            "a token has refilled"
        );
        assert!(
            denial(Store::Table, &t, 100_000, 1).is_none(),
            "and the entry is gone"
        );
    }

    #[test]
    fn a_smaller_cost_or_a_clock_behind_the_entry_goes_to_the_store() {
        forget_all();
        let t = target("a", 2);
        remember(
            Store::Table,
            &t,
            State {
                level: S,
                at: 10 * S,
            },
        ); // one token
        assert!(denial(Store::Table, &t, 10 * S, 2).is_some());
        assert!(denial(Store::Table, &t, 10 * S, 1).is_none());
        remember(
            Store::Table,
            &t,
            State {
                level: 0,
                at: 10 * S,
            },
        );
        assert!(
            denial(Store::Table, &t, 9 * S, 1).is_none(),
            "clock stepped back"
        );
        remember(
            Store::Table,
            &t,
            State {
                level: 0,
                at: 10 * S,
            },
        );
        forget(&t.namespace, t.key);
        assert!(denial(Store::Table, &t, 10 * S, 1).is_none());
    }

    #[test]
    fn stays_bounded() {
        forget_all();
        let keys: Vec<String> = (0..CAPACITY + 10).map(|i| format!("k{i}")).collect();
        for k in &keys {
            remember(Store::Table, &target(k, 1), State { level: 0, at: 0 });
        }
        SHORT.with(|m| assert!(m.borrow().len() <= CAPACITY));
    }
}
