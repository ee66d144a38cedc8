//! The calls of one key that are not takes, written once over the [`Store`] as [`super::take`] is: a
//! charge after the fact, a refund, and a concurrency policy's lease acquired and released. Each answers
//! as a take does ([`Answer`]: the outcome, and what the backend's memory of short buckets should do);
//! the caller counts the statistics.

use super::{blocks, Answer, Memo, Store};
use crate::algorithm::{leases_outcome, slot_namespace, slot_of};
use crate::target::{Ask, Namespace, Target};

/// Charges `cost` tokens to the bucket of `target`, whatever it holds, down to `max_debt` tokens below
/// zero ([`crate::algorithm::Policy::charge`]), creating the bucket when missing: always allowed; the
/// bucket afterwards. A key with an override's answer is charged nothing (an exempt key's bucket is not in
/// use, a denied key's has nothing to give). Its bucket is forgotten by the backend's memory once charged.
pub fn charge<S: Store>(
    s: &S,
    target: &Target<'_>,
    cost: i64,
    max_debt: i64,
) -> Result<Answer, S::Error> {
    let outcome = match target.verdict {
        Some(v) => v.outcome(&target.policy, s.now()?),
        None => s.write(target, Ask::Charge { cost, max_debt })?,
    };
    Ok(Answer {
        memo: if cost > 0 { Memo::Forget } else { Memo::Keep },
        ..Answer::of(outcome)
    })
}

/// Puts up to `tokens` back into the bucket of `target`, never above its capacity; the bucket afterwards.
/// A missing bucket is full: nothing is written. A key with an override's answer gets nothing back (its
/// bucket is not in use). The backend forgets what it remembered of the bucket, which now holds more.
pub fn refund<S: Store>(s: &S, target: &Target<'_>, tokens: i64) -> Result<Answer, S::Error> {
    if let Some(v) = target.verdict {
        return Ok(Answer::of(v.outcome(&target.policy, s.now()?)));
    }
    let outcome = s.update(target, |stored, now| target.refund(stored, now, tokens))?;
    Ok(Answer {
        memo: Memo::Forget,
        ..Answer::of(outcome)
    })
}

/// Acquires a lease of the key of `target` (a concurrency policy's): its first free slot takes lease id
/// `lease_id(random, slot)` ([`Store::acquire`]). The answer over every slot
/// ([`crate::algorithm::leases_outcome`]) and the lease when granted. A blocked key gets no lease (in
/// shadow mode blocks are not read: an acquire in shadow mode never denies for them); a denial is counted
/// in the policy's penalty box, as a take's is.
pub fn acquire<S: Store>(
    s: &S,
    target: &Target<'_>,
    random: u64,
) -> Result<(Answer, Option<i64>), S::Error> {
    let one = std::slice::from_ref(target);
    if !target.shadow {
        if let Some(o) = blocks::blocked(s, one)?.into_iter().flatten().next() {
            let answer = Answer {
                by_block: true,
                ..Answer::of(o)
            };
            return Ok((answer, None));
        }
    }
    let names = slot_names(target);
    let slots = slot_targets(target, &names);
    let (states, granted, now) = s.acquire(&slots, random)?;
    let outcome = leases_outcome(&target.policy, &states, now, granted.is_some(), granted);
    let mut answers = [Answer::of(outcome)];
    blocks::count_denials(s, one, &mut answers)?;
    let [answer] = answers;
    Ok((answer, granted.map(|g| g.level)))
}

/// Releases lease `lease` of the key of `target` (a concurrency policy's): true if it was held and is now
/// free; false if it had expired, was released already, or is not one of this key's slots. Only the slot
/// the lease names is locked and read, and written only when released.
pub fn release<S: Store>(s: &S, target: &Target<'_>, lease: i64) -> Result<bool, S::Error> {
    let slot = slot_of(lease);
    if lease <= 0 || slot >= target.policy.rate() {
        return Ok(false);
    }
    let names = [slot_namespace(target.namespace.stored_name(), slot)];
    let slot = &slot_targets(target, &names)[0];
    let ask = Ask::Release { lease };
    s.update(slot, |stored, now| {
        let o = slot.answer(stored, now, ask);
        (o.allowed.then_some(o.state), o.allowed)
    })
}

/// The namespaces of the slots of a concurrency policy's keys ([`slot_namespace`]), one per lease it
/// allows at once.
pub fn slot_names(target: &Target<'_>) -> Vec<String> {
    let name = target.namespace.stored_name();
    (0..target.policy.rate())
        .map(|slot| slot_namespace(name, slot))
        .collect()
}

/// The slots of the key of `target`: `target` in each namespace of `names` ([`slot_names`]), with no
/// shadow mode, block or override of their own (those are the key's, decided before).
pub fn slot_targets<'a>(target: &Target<'a>, names: &'a [String]) -> Vec<Target<'a>> {
    let created_at = target.namespace.created_at();
    names
        .iter()
        .map(|name| Target {
            namespace: Namespace::Policy { name, created_at },
            shadow: false,
            blocking: None,
            verdict: None,
            ..*target
        })
        .collect()
}
