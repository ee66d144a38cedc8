//! Blocks in the pipeline, the same for every store (the arithmetic is [`crate::algorithm::block`]'s). A
//! key of a named policy has a block bucket beside its bucket:
//!
//! - before a call touches a policy's bucket, the key's block bucket is read (nothing is written): a
//!   blocked key is denied there, without its bucket being looked at. Only a bucket the backend remembers
//!   short answers first: the call is denied either way, and the penalty box (whose count reports a block)
//!   or the bucket's refill ends that; a block started by a call makes the backend forget the bucket;
//! - after a denial by a bucket whose policy has a penalty box, the denial is counted in the block bucket
//!   (a write that is always granted, like a charge), which blocks the key at the penalty box's limit;
//! - under shadow mode the penalty box counts the would-be denials in a block bucket of its own
//!   ([`shadow_block_namespace`]), which a shadowed call reads as well as the real one and reports as a
//!   would-be denial: a block a shadowed penalty box would have made is never enforced once shadow mode
//!   ends.
//!
//! Blocks by hand (and lifting them) write the block bucket directly; the extension's seam does that with
//! [`block_target`], beside its note that the policy now may hold such blocks.

use super::{Answer, Memo, PerTarget, Store};
use crate::algorithm::{block_namespace, shadow_block_namespace, Outcome};
use crate::target::{Blocking, Namespace, Target};

/// The namespace of the block bucket of `target` and how it is blocked; `None` when it cannot be.
/// `shadow` names the one its penalty box counts in under shadow mode.
pub fn block_in(target: &Target<'_>, shadow: bool) -> Option<(String, Blocking)> {
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
pub fn block_of(target: &Target<'_>) -> Option<(String, Blocking)> {
    block_in(target, false)
}

/// The block bucket of `target`, named `name`.
pub fn block_target<'a>(target: &Target<'a>, name: &'a str, blocking: &Blocking) -> Target<'a> {
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

/// Whether `target`'s key certainly holds no block, so that its block bucket need not be read: its
/// policy has no blocks, or has no penalty box and the store knows of no block made by hand under it.
pub fn holds_no_block<S: Store>(s: &S, target: &Target<'_>) -> Result<bool, S::Error> {
    match target.blocking {
        None => Ok(true),
        Some(b) => Ok(!b.may_be_blocked() && !s.reads_block_anyway(target)?),
    }
}

/// Reads the block buckets of `targets` (nothing is written): for each target, the outcome of its block
/// when its key is blocked (denied, `retry_after` the block's end), `None` otherwise.
pub fn blocked<S: Store>(
    s: &S,
    targets: &[Target<'_>],
) -> Result<PerTarget<Option<Outcome>>, S::Error> {
    // (target, block bucket name and numbers): a shadowed call reads the block its shadowed penalty box
    // would have made too
    let mut blocks: Vec<(usize, (String, Blocking))> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        if holds_no_block(s, t)? {
            continue;
        }
        let shadow = if t.shadow { block_in(t, true) } else { None };
        blocks.extend([block_of(t), shadow].into_iter().flatten().map(|b| (i, b)));
    }
    let mut found: PerTarget<Option<Outcome>> = smallvec::smallvec![None; targets.len()];
    if blocks.is_empty() {
        return Ok(found);
    }
    let buckets: Vec<Target<'_>> = blocks
        .iter()
        .map(|(i, (name, blocking))| block_target(&targets[*i], name, blocking))
        .collect();
    let outcomes = s.read(&buckets)?;
    for ((i, _), o) in blocks.iter().zip(outcomes) {
        if !o.allowed && found[*i].is_none() {
            found[*i] = Some(o);
        }
    }
    Ok(found)
}

/// Counts, in its penalty box, each denial of a call by a bucket whose policy has one (`answers[i]` is
/// `targets[i]`'s); a denial by the key's block or override is not counted again. A denial that starts a
/// block is reported as the block (its `retry_after` the block's end), and its bucket forgotten. In the
/// lock order: the counted keys in (namespace, key) order, each key's bucket before its block bucket.
pub fn count_denials<S: Store>(
    s: &S,
    targets: &[Target<'_>],
    answers: &mut [Answer],
) -> Result<(), S::Error> {
    if let ([t], [a]) = (targets, &mut *answers) {
        return count_denial(s, t, a);
    }
    let mut order: Vec<usize> = (0..targets.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&targets[a], &targets[b]);
        (ta.namespace.stored_name(), ta.key).cmp(&(tb.namespace.stored_name(), tb.key))
    });
    for i in order {
        count_denial(s, &targets[i], &mut answers[i])?;
    }
    Ok(())
}

/// Counts the denial of target `t` in its penalty box, if it has one and the denial was its bucket's (see
/// [`count_denials`]).
fn count_denial<S: Store>(s: &S, t: &Target<'_>, a: &mut Answer) -> Result<(), S::Error> {
    let Some(block_for) = t.blocking.and_then(|b| b.penalty_for) else {
        return Ok(());
    };
    if a.outcome.allowed || a.by_block || t.verdict.is_some() {
        return Ok(());
    }
    let Some((name, blocking)) = block_in(t, t.shadow) else {
        return Ok(());
    };
    let bucket = block_target(t, &name, &blocking);
    let Some(counted) = s.count_denial(t, &bucket, block_for)? else {
        return Ok(());
    };
    // the count reports its bucket: a retry_after means the key is blocked now; the backend's memory of
    // its short bucket must not answer for it any more
    if counted.retry_after.is_some() {
        a.memo = Memo::Forget;
        a.outcome = Outcome {
            allowed: false,
            ..counted
        };
    }
    Ok(())
}
