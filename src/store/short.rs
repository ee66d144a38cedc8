//! Per-backend memory of buckets seen short, so that a flood of calls on a drained bucket is denied without
//! touching the table or the shared hash table at all.
//!
//! Soundness: a denial is remembered with the instant [`crate::bucket::Bucket::available_at`] computed from
//! the committed state it read. Between refills, other sessions can only remove tokens from a bucket, so
//! until that instant the bucket cannot hold the tokens asked for, and a denial from memory gives the same
//! answer a read would. The exceptions are refunds, which add tokens:
//! - this backend's own transaction rolling back (a denial it saw may have counted its own uncommitted
//!   take): the memory is cleared at every transaction abort;
//! - `rate_limit.reset(id)`: cleared for that id in the backend that resets; other backends see the reset
//!   once their remembered instant has passed, at most one token's refill time (`1 / refill_per_sec`
//!   seconds) later.
//!
//! Entries are keyed by store, id and limit; the memory holds at most [`CAPACITY`] ids and is emptied when full.

use std::cell::RefCell;
use std::collections::HashMap;

/// Ids remembered at most per backend.
pub const CAPACITY: usize = 4096;

struct Entry {
    memory: bool,
    rate: i64,
    burst: i64,
    until: i64,
}

thread_local! {
    static SHORT: RefCell<HashMap<String, Entry>> = RefCell::new(HashMap::new());
}

/// True if `id` of the table store (`memory == false`) or the memory store, under this limit, is known to
/// be short of tokens at `now`.
pub fn is_short(memory: bool, id: &str, rate: i64, burst: i64, now: i64) -> bool {
    SHORT.with(|m| {
        m.borrow().get(id).is_some_and(|e| {
            e.memory == memory && e.rate == rate && e.burst == burst && now < e.until
        })
    })
}

/// Remembers that `id` of that store under this limit cannot grant before `until`.
pub fn remember(memory: bool, id: &str, rate: i64, burst: i64, until: i64) {
    SHORT.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= CAPACITY && !m.contains_key(id) {
            m.clear();
        }
        let entry = Entry {
            memory,
            rate,
            burst,
            until,
        };
        m.insert(id.to_string(), entry);
    });
}

/// Forgets `id` (after a reset in this backend).
pub fn forget(id: &str) {
    SHORT.with(|m| {
        m.borrow_mut().remove(id);
    });
}

/// Forgets everything (at transaction abort: a rolled-back take may have been refunded).
pub fn forget_all() {
    SHORT.with(|m| m.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_the_instant_and_only_for_the_same_limit() {
        forget_all();
        remember(false, "a", 2, 120, 1_000);
        assert!(is_short(false, "a", 2, 120, 999));
        assert!(!is_short(false, "a", 2, 120, 1_000));
        assert!(!is_short(false, "a", 3, 120, 999));
        assert!(!is_short(false, "b", 2, 120, 999));
        assert!(
            !is_short(true, "a", 2, 120, 999),
            "the other store's bucket is another bucket"
        );
        forget("a");
        assert!(!is_short(false, "a", 2, 120, 999));
    }

    #[test]
    fn stays_bounded() {
        forget_all();
        for i in 0..CAPACITY + 10 {
            remember(false, &format!("k{i}"), 1, 1, i64::MAX);
        }
        SHORT.with(|m| assert!(m.borrow().len() <= CAPACITY));
    }
}
