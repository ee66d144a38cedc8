//! Blocks by hand at the seam, the same for both stores. What a block does to a call (a key's block bucket
//! read before its policy's bucket, the penalty box counting denials after, shadow mode's block buckets)
//! is the model's pipeline ([`rate_limit_model::pipeline::blocks`]); the arithmetic is
//! [`rate_limit_model::algorithm::block`]'s. Here: a block by hand writes the key's block bucket and notes,
//! as its store can, that the policy's keys may now hold such blocks; lifting it writes a clear one (which
//! the purge deletes). The table store writes in the caller's transaction; the memory store at once.
//!
//! A block bucket is an ordinary bucket of its store: it takes room in the database's share of the memory
//! store like any other, is listed in `rate_limit.buckets` under its policy (algorithm `block`), deleted
//! with its policy, and purged once clear.

use std::cell::Cell;

use pgrx::pg_sys::panic::ErrorReport;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::pipeline::blocks::{block_in, block_of, block_target};
use rate_limit_model::target::{Ask, Target};

use super::buckets::Buckets;

thread_local! {
    /// How many calls have read block buckets in this backend (for the tests that they are read only
    /// where a block can exist).
    static BLOCK_READS: Cell<u64> = const { Cell::new(0) };
}

/// How many calls have read block buckets in this backend.
#[cfg(any(test, feature = "pg_test"))]
pub fn block_reads() -> u64 {
    BLOCK_READS.with(Cell::get)
}

/// Counts one call's read of block buckets.
pub(super) fn count_block_read() {
    BLOCK_READS.with(|c| c.set(c.get() + 1));
}

/// Blocks the key of `target` (a named policy's bucket) for `duration` µs from now, replacing any block or
/// count it had; returns its block bucket afterwards.
pub(super) fn block(
    s: &impl Buckets,
    function: &'static str,
    target: &Target<'_>,
    duration: i64,
) -> Result<Outcome, ErrorReport> {
    let Some((name, blocking)) = block_of(target) else {
        return Err(crate::error::bug(function, "this bucket cannot be blocked"));
    };
    let bucket = block_target(target, &name, &blocking);
    let blocked = s.write(function, &bucket, Ask::Block { duration })?;
    s.note_block_by_hand(function, target)?;
    Ok(blocked)
}

/// Lifts the block of the key of `target` and forgets the denials its penalty box counted, in shadow mode
/// too: true if the key was blocked (or would have been, under shadow mode).
pub(super) fn unblock(
    s: &impl Buckets,
    function: &'static str,
    target: &Target<'_>,
) -> Result<bool, ErrorReport> {
    // the real block, and the one a shadowed penalty box would have made
    let mut was_blocked = false;
    for (name, blocking) in [block_of(target), block_in(target, true)]
        .into_iter()
        .flatten()
    {
        let bucket = block_target(target, &name, &blocking);
        // a clear state written over the bucket (a missing one is clear already)
        let step = |stored, now| {
            let blocked = !bucket.evaluate(stored, now, 0).allowed;
            (stored.map(|_| bucket.policy.full(now)), blocked)
        };
        was_blocked |= s.update(function, &bucket, step)?;
    }
    Ok(was_blocked)
}
