//! Blocks at the seam, the same for both stores (the arithmetic is the model's, see
//! [`crate::algorithm::block`]). A key of a named policy has a block bucket beside its bucket:
//!
//! - before a call touches a policy's bucket, the key's block bucket is read (in a fresh snapshot in the
//!   table store; nothing is written): a blocked key is denied there, without its bucket being looked at.
//!   Only a bucket this backend remembers short ([`super::short`]) answers first: the call is denied
//!   either way, and the penalty box (whose count reports a block) or the bucket's refill ends that;
//!   a block started by this backend makes it forget the bucket;
//! - after a denial by a bucket whose policy has a penalty box, the denial is counted in the block bucket (a
//!   write that is always granted, like a charge), which blocks the key at the penalty box's limit. The
//!   table store counts in the caller's transaction (a ROLLBACK forgets the count) and not at all in a
//!   read-only transaction, which cannot write; the memory store counts at once, whatever the caller does
//!   next;
//! - a block by hand writes the block bucket; lifting it writes a clear one (which the purge deletes);
//! - under shadow mode the penalty box counts the would-be denials in a block bucket of its own (namespace
//!   [`shadow_block_namespace`]), which a shadowed call reads as well as the real one and reports as a
//!   would-be denial: a block a shadowed penalty box would have made is never enforced once shadow mode
//!   ends (before: it was, for the rest of its `block_for`, and nothing said so).
//!
//! A block bucket is an ordinary bucket of its store: it takes room in the database's share of the memory
//! store like any other, is listed in `rate_limit.buckets` under its policy (algorithm `block`), deleted
//! with its policy, and purged once clear.

use std::cell::Cell;

use pgrx::pg_sys::panic::ErrorReport;

use super::buckets::Buckets;
use crate::algorithm::{block_namespace, shadow_block_namespace, Outcome};
use crate::target::{Ask, Blocking, Namespace, Target};

thread_local! {
    /// How many calls read block buckets in this backend (for the tests that they are read only where a
    /// block can exist).
    static BLOCK_READS: Cell<u64> = const { Cell::new(0) };
}

/// How many calls have read block buckets in this backend.
#[cfg(any(test, feature = "pg_test"))]
pub fn block_reads() -> u64 {
    BLOCK_READS.with(Cell::get)
}

/// The namespace of the block bucket of `target` and how it is blocked; `None` when it cannot be. `shadow`
/// names the one its penalty box counts in under shadow mode.
fn block_in(target: &Target<'_>, shadow: bool) -> Option<(String, Blocking)> {
    match (target.blocking, target.namespace) {
        (Some(blocking), Namespace::Policy { name, .. }) => {
            let namespace = if shadow {
                shadow_block_namespace(name)
            } else {
                block_namespace(name)
            };
            Some((namespace, blocking))
        }
        _ => None,
    }
}

/// The real block bucket of `target` (see [`block_in`]).
fn block_of(target: &Target<'_>) -> Option<(String, Blocking)> {
    block_in(target, false)
}

/// The block bucket of `target`, named `name`.
fn block_target<'a>(target: &Target<'a>, name: &'a str, blocking: &Blocking) -> Target<'a> {
    Target {
        namespace: Namespace::Policy {
            name,
            created_at: target.namespace.created_at(),
        },
        key: target.key,
        policy: blocking.bucket,
        // a block keeps its end whatever the policy's numbers become (the model's carry-over)
        changed_at: i64::MIN,
        shadow: false,
        blocking: None,
        verdict: None,
    }
}

/// Reads the block buckets of `targets` (nothing is written): for each target, the outcome of its block
/// when its key is blocked (denied, `retry_after` the block's end), `None` otherwise.
pub(super) fn blocked(
    s: &impl Buckets,
    function: &'static str,
    targets: &[Target<'_>],
) -> Result<Vec<Option<Outcome>>, ErrorReport> {
    // a key of a policy without a penalty box holds no block unless one was made by hand
    let unblockable = |t: &Target<'_>| t.blocking.is_some_and(|b| !b.may_be_blocked());
    // a shadowed call reads the block its shadowed penalty box would have made too
    let mut blocks: Vec<(usize, (String, Blocking))> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        if unblockable(t) && !s.reads_block_anyway(function, t)? {
            continue;
        }
        let shadow = if t.shadow { block_in(t, true) } else { None };
        blocks.extend([block_of(t), shadow].into_iter().flatten().map(|b| (i, b)));
    }
    let mut index = Vec::with_capacity(blocks.len());
    let mut buckets = Vec::with_capacity(blocks.len());
    for (i, (name, blocking)) in &blocks {
        index.push(*i);
        buckets.push(block_target(&targets[*i], name, blocking));
    }
    let mut found = vec![None; targets.len()];
    if buckets.is_empty() {
        return Ok(found);
    }
    BLOCK_READS.with(|c| c.set(c.get() + 1));
    // fresh: a block committed since the caller's transaction began applies at once
    let outcomes = s.peek_fresh(function, &buckets)?;
    for (i, o) in index.into_iter().zip(outcomes) {
        if !o.allowed && found[i].is_none() {
            found[i] = Some(o);
        }
    }
    Ok(found)
}

/// Counts, in its penalty box, each denial of a call (`outcomes[i]` is `targets[i]`'s) by a bucket whose
/// policy has one; `blocked[i]` marks the targets denied by their block, whose denials are not counted
/// again. A denial that starts a block is reported as the block (its `retry_after` the block's end).
/// Nothing in a read-only transaction of the table store (see the module comment).
pub(super) fn count_denials(
    s: &impl Buckets,
    function: &'static str,
    targets: &[Target<'_>],
    outcomes: &mut [Outcome],
    blocked: &[Option<Outcome>],
) -> Result<(), ErrorReport> {
    // in the seam's lock order: the keys' buckets in (namespace, key) order, each before its block bucket
    if targets.len() == 1 {
        return count_denial(s, function, &targets[0], &mut outcomes[0], &blocked[0]);
    }
    let mut order: Vec<usize> = (0..targets.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&targets[a], &targets[b]);
        (ta.namespace.stored_name(), ta.key).cmp(&(tb.namespace.stored_name(), tb.key))
    });
    for i in order {
        count_denial(s, function, &targets[i], &mut outcomes[i], &blocked[i])?;
    }
    Ok(())
}

/// Counts the denial `o` of target `t` in its penalty box, if it has one and `blocked` (its block's
/// outcome) did not deny it already (see [`count_denials`]).
fn count_denial(
    s: &impl Buckets,
    function: &'static str,
    t: &Target<'_>,
    o: &mut Outcome,
    blocked: &Option<Outcome>,
) -> Result<(), ErrorReport> {
    let Some(block_for) = t.blocking.and_then(|b| b.penalty_for) else {
        return Ok(());
    };
    if o.allowed || blocked.is_some() {
        return Ok(());
    }
    let Some((name, blocking)) = block_in(t, t.shadow) else {
        return Ok(());
    };
    let bucket = block_target(t, &name, &blocking);
    // the lock order (see the seam): the policy's bucket before its block bucket
    if !s.prepare_count(function, t)? {
        return Ok(());
    }
    let counted = s.write(function, &bucket, Ask::CountDenial { block_for })?;
    // the count reports its bucket: a retry_after means the key is blocked now; this backend's memory of
    // its short bucket must not answer for it any more
    if counted.retry_after.is_some() {
        super::short::forget(&t.namespace, t.key);
        *o = Outcome {
            allowed: false,
            ..counted
        };
    }
    Ok(())
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
