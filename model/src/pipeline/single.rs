//! The calls of one key that are not plain takes, written once over the [`Store`] as [`super::take`] is:
//! a charge after the fact, a refund, a concurrency policy's lease acquired and released, and a
//! reservation made and settled. Each answers as a take does ([`Answer`]: the outcome, and what the
//! backend's memory of short buckets should do); the caller counts the statistics.

use super::{blocks, take, Answer, Memo, Store};
use crate::algorithm::{leases_outcome, slot_namespace, slot_of, Outcome};
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

/// Reserves `estimate` tokens of the key of `target` as a take of them would ([`super::take`], with the
/// backend's memory `remembered_short`), and when they were taken from its bucket records them in the
/// bucket of `reservation` (a fresh reservation's, [`crate::algorithm::reservation`]), to be settled or to
/// expire. The answer of the take, and whether a reservation was recorded: none when the call was denied,
/// nor when no token was taken (an exempt key, a would-be denial in shadow mode), so that a settle never
/// gives back tokens nobody took. The key's bucket is locked before the reservation's (the lock order).
pub fn reserve<S: Store>(
    s: &S,
    remembered_short: impl FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    target: &Target<'_>,
    reservation: &Target<'_>,
    estimate: i64,
) -> Result<(Answer, bool), S::Error> {
    // one target, one answer
    let answer = take(s, remembered_short, std::slice::from_ref(target), estimate)?[0];
    let taken = answer.outcome.allowed && target.verdict.is_none() && estimate > 0;
    if !taken {
        return Ok((answer, false));
    }
    let recorded = s.write(reservation, Ask::Take(estimate))?;
    Ok((answer, recorded.allowed))
}

/// Settles the reservation whose bucket is `reservation` on `actual` tokens used by the key of `target`:
/// if it is held (not settled, not expired), frees it and puts back into the key's bucket what was
/// reserved and not used ([`refund`], never above the capacity), or charges what was used beyond it
/// ([`charge`], down to `max_debt` tokens of debt). The key's bucket afterwards, and whether this call
/// settled the reservation; a reservation settled already, expired (settled at its estimate) or unknown
/// changes nothing, so a settle is idempotent and gives back at most what its reservation took.
///
/// Locks the reservation's bucket, then the key's: the one call that locks a bucket after a reservation's.
/// No call waits for a reservation's bucket while holding its key's: a reserve creates it under an id
/// nobody else knows yet, and every other call that locks it is a settle, which holds nothing before it.
pub fn settle<S: Store>(
    s: &S,
    target: &Target<'_>,
    reservation: &Target<'_>,
    actual: i64,
    max_debt: i64,
) -> Result<(Answer, bool), S::Error> {
    let reserved = s.update(reservation, |stored, now| {
        let held = stored
            .map(|st| reservation.current(Some(st), now))
            .and_then(|state| reservation.policy.settle_slot(state, now));
        match held {
            Some((free, tokens)) => (Some(free), Some(tokens)),
            None => (None, None),
        }
    })?;
    let Some(reserved) = reserved else {
        return Ok((report(s, target)?, false));
    };
    let answer = match actual.cmp(&reserved) {
        std::cmp::Ordering::Less => refund(s, target, reserved - actual)?,
        std::cmp::Ordering::Greater => charge(s, target, actual - reserved, max_debt)?,
        std::cmp::Ordering::Equal => report(s, target)?,
    };
    Ok((answer, true))
}

/// What [`settle`] would answer now, writing nothing: for a store that settles when the caller's
/// transaction commits (the memory store), the answer of the call. The reservation is read (a take of 0
/// tokens) and, when it is held and `settled_before` is false (no earlier settle of it is waiting for the
/// same commit), the key's bucket is reported as the settle's refund or charge would leave it.
pub fn settle_preview<S: Store>(
    s: &S,
    target: &Target<'_>,
    reservation: &Target<'_>,
    actual: i64,
    max_debt: i64,
    settled_before: bool,
) -> Result<(Answer, bool), S::Error> {
    let now = s.now()?;
    let held = s.take(std::slice::from_ref(reservation), 0)?[0];
    let reserved = held.remaining;
    let answer = report(s, target)?;
    if settled_before || reserved <= 0 {
        return Ok((answer, false));
    }
    if target.verdict.is_some() {
        return Ok((answer, true));
    }
    let (policy, state) = (target.policy, answer.outcome.state);
    let outcome = match actual.cmp(&reserved) {
        std::cmp::Ordering::Less => {
            policy.take(policy.refund(state, now, reserved - actual), now, 0)
        }
        std::cmp::Ordering::Greater => policy.charge(state, now, actual - reserved, max_debt),
        std::cmp::Ordering::Equal => answer.outcome,
    };
    Ok((Answer::of(outcome), true))
}

/// The key of `target` as it is, writing nothing: its override's answer, or its bucket (a take of 0
/// tokens, which only reports).
fn report<S: Store>(s: &S, target: &Target<'_>) -> Result<Answer, S::Error> {
    let outcome = match target.verdict {
        Some(v) => v.outcome(&target.policy, s.now()?),
        None => s.take(std::slice::from_ref(target), 0)?[0],
    };
    Ok(Answer::of(outcome))
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
