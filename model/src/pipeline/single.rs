//! The calls of one key that are not plain takes, written once over the [`Store`] as [`super::take`] is:
//! a charge after the fact, a refund, a concurrency policy's lease acquired and released, a
//! reservation made and settled, and tokens booked ahead. Each answers as a take does ([`Answer`]: the outcome, and what the
//! backend's memory of short buckets should do); the caller counts the statistics.

use super::{blocks, outcomes, take, take_costs, Answer, Memo, PerTarget, Store};
use crate::algorithm::{
    leases_outcome, slot_namespace, slot_of, Adaptive, Outcome, Policy, Report, MAX_HOLD_US,
};
use crate::target::{granted, Ask, Namespace, Stored, Target};

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

/// The adaptive limit of one key of an adaptive concurrency policy ([`crate::algorithm::adaptive`]): its
/// bucket (namespace [`crate::algorithm::limit_namespace`], the key's own key, numbers
/// [`Policy::adaptive_limit`]) and the policy's settings.
#[derive(Clone, Copy, Debug)]
pub struct KeyLimit<'a> {
    /// The limit's bucket.
    pub bucket: Target<'a>,
    /// The policy's adaptive settings.
    pub settings: Adaptive,
}

/// How a released call went, for its key's adaptive limit.
#[derive(Clone, Copy, Debug)]
pub struct CallReport<'a> {
    /// The key's limit.
    pub limit: KeyLimit<'a>,
    /// The outcome the caller reported.
    pub report: Report,
    /// The latency the caller reported, in µs; `None`: how long the lease was held.
    pub latency_us: Option<i64>,
}

/// Acquires a lease of the key of `target` (a concurrency policy's): its first free slot takes lease id
/// `lease_id(random, slot)` ([`Store::acquire`]). The answer over every slot
/// ([`crate::algorithm::leases_outcome`]) and the lease when granted. A blocked key gets no lease (in
/// shadow mode blocks are not read: an acquire in shadow mode never denies for them); a denial is counted
/// in the policy's penalty box, as a take's is. Under an adaptive policy (`limit`), the key's limit is
/// read (not locked) and only the slots below it are tried and reported.
pub fn acquire<S: Store>(
    s: &S,
    target: &Target<'_>,
    random: u64,
    limit: Option<&KeyLimit<'_>>,
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
    let mut slots = slot_targets(target, &names);
    if let Some(l) = limit {
        let read = s.read(std::slice::from_ref(&l.bucket))?;
        let allowed = l.settings.limit(read.first().map(|o| o.state));
        slots.truncate(usize::try_from(allowed).unwrap_or(0));
    }
    let (states, granted, now) = s.acquire(&slots, random)?;
    let outcome = leases_outcome(&target.policy, &states, now, granted.is_some(), granted);
    let mut answers = [Answer::of(outcome)];
    blocks::count_denials(s, one, &mut answers)?;
    let [answer] = answers;
    Ok((answer, granted.map(|g| g.level)))
}

/// Releases lease `lease` of the key of `target` (a concurrency policy's): true if it was held and is now
/// free; false if it had expired, was released already, or is not one of this key's slots. Only the slot
/// the lease names is locked and read, and written only when released. Under an adaptive policy
/// (`report`), a lease released adapts its key's limit: the limit is read, and locked and written (after
/// the slot, the lock order) only when the report changes it.
pub fn release<S: Store>(
    s: &S,
    target: &Target<'_>,
    lease: i64,
    report: Option<&CallReport<'_>>,
) -> Result<bool, S::Error> {
    let slot = slot_of(lease);
    if lease <= 0 || slot >= target.policy.rate() {
        return Ok(false);
    }
    let names = [slot_namespace(target.namespace.stored_name(), slot)];
    let slot = &slot_targets(target, &names)[0];
    let ask = Ask::Release { lease };
    let released = s.update(slot, |stored, now| {
        let acquired_at = slot.current(stored, now).at;
        let o = slot.answer(stored, now, ask);
        (
            o.allowed.then_some(o.state),
            o.allowed.then_some((acquired_at, now)),
        )
    })?;
    let (Some((acquired_at, now)), Some(r)) = (released, report) else {
        return Ok(released.is_some());
    };
    let ask = Ask::Adapt {
        settings: r.limit.settings,
        acquired_at,
        latency_us: r
            .latency_us
            .unwrap_or_else(|| now.saturating_sub(acquired_at)),
        report: r.report,
    };
    let bucket = &r.limit.bucket;
    // most reports of a healthy key change nothing (a limit at its most): read before locking
    let read = s.read(std::slice::from_ref(bucket))?;
    let current = read.first().map(|o| o.state);
    if current.is_some_and(|state| {
        bucket
            .answer(
                Some(Stored {
                    state,
                    policy: bucket.policy,
                }),
                now,
                ask,
            )
            .allowed
    }) {
        s.write(bucket, ask)?;
    }
    Ok(true)
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

/// [`reserve`] over several buckets at once (one key's under several policies, each weighing the work its
/// own way): takes `estimates[i]` tokens from `targets[i]`, all or nothing ([`crate::pipeline::take_costs`]),
/// and when they were taken records each target's in its bucket `reservations[i]` (one reservation id
/// across them), all together ([`Store::record`]). The answers of the take, and whether the reservations
/// were recorded: none when the call was denied, and none of a target from which no token was taken (an
/// exempt key, a would-be denial in shadow mode). The targets' buckets are locked before any reservation's (the lock order).
pub fn reserve_many<S: Store>(
    s: &S,
    remembered_short: impl FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    targets: &[Target<'_>],
    reservations: &[Target<'_>],
    estimates: &[i64],
) -> Result<(PerTarget<Answer>, bool), S::Error> {
    let answers = take_costs(s, remembered_short, targets, estimates)?;
    if !granted(targets, &outcomes(&answers)) {
        return Ok((answers, false));
    }
    // recorded together (one pass where the store can), for the targets tokens were taken from
    let (held, amounts): (PerTarget<Target<'_>>, PerTarget<i64>) = targets
        .iter()
        .zip(reservations)
        .zip(&answers)
        .zip(estimates)
        .filter(|(((t, _), a), estimate)| {
            a.outcome.allowed && t.verdict.is_none() && **estimate > 0
        })
        .map(|(((_, r), _), estimate)| (*r, *estimate))
        .unzip();
    let recorded = !held.is_empty() && s.record(&held, &amounts)?;
    Ok((answers, recorded))
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
    let reserved = free_held(s, reservation)?.map(|(tokens, _)| tokens);
    Ok((
        settle_freed(s, target, reserved, actual, max_debt)?,
        reserved.is_some(),
    ))
}

/// What a settle does to the key's bucket of `target` once its reservation is freed: `reserved` tokens
/// (`None`: it held none, and the bucket is only reported) against `actual` used.
fn settle_freed<S: Store>(
    s: &S,
    target: &Target<'_>,
    reserved: Option<i64>,
    actual: i64,
    max_debt: i64,
) -> Result<Answer, S::Error> {
    let Some(reserved) = reserved else {
        return report(s, target);
    };
    match actual.cmp(&reserved) {
        std::cmp::Ordering::Less => refund(s, target, reserved - actual),
        std::cmp::Ordering::Greater => charge(s, target, actual - reserved, max_debt),
        std::cmp::Ordering::Equal => report(s, target),
    }
}

/// [`settle`] of one reservation id under several policies of one key: `reservations[i]` settled on
/// `actuals[i]` tokens used in the key's bucket `targets[i]`, down to `max_debts[i]` of debt. Every
/// reservation's bucket is freed first, then every key's bucket refunded or charged, each in the order
/// given (the caller's lock order, the same for every call): so, as for one settle, no call waits for a
/// reservation's bucket while it holds a key's. Each key's bucket afterwards, and whether its reservation
/// was settled by this call.
pub fn settle_many<S: Store>(
    s: &S,
    targets: &[Target<'_>],
    reservations: &[Target<'_>],
    actuals: &[i64],
    max_debts: &[i64],
) -> Result<PerTarget<(Answer, bool)>, S::Error> {
    let mut freed: PerTarget<Option<i64>> = PerTarget::with_capacity(reservations.len());
    for r in reservations {
        freed.push(free_held(s, r)?.map(|(tokens, _)| tokens));
    }
    let mut settled = PerTarget::with_capacity(targets.len());
    for (((t, reserved), actual), max_debt) in targets.iter().zip(freed).zip(actuals).zip(max_debts)
    {
        settled.push((
            settle_freed(s, t, reserved, *actual, *max_debt)?,
            reserved.is_some(),
        ));
    }
    Ok(settled)
}

/// Frees the reservation (or booking) whose bucket is `held` if it is held (not settled, not expired): the
/// tokens it held and when it would have expired; `None` when it holds none, and nothing is written.
fn free_held<S: Store>(s: &S, held: &Target<'_>) -> Result<Option<(i64, i64)>, S::Error> {
    s.update(held, |stored, now| {
        let freed = stored
            .map(|st| held.current(Some(st), now))
            .and_then(|state| {
                let expiry = held.policy.reservation_expiry(state);
                held.policy
                    .settle_slot(state, now)
                    .map(|(free, tokens)| (free, (tokens, expiry)))
            });
        match freed {
            Some((free, found)) => (Some(free), Some(found)),
            None => (None, None),
        }
    })
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
    let held = s.take(std::slice::from_ref(reservation), &[0])?[0];
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

/// What [`book`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Booked {
    /// The key's answer: allowed when its tokens are booked (or its key is exempt, or in shadow mode).
    pub answer: Answer,
    /// When booked: microseconds until the booked tokens exist, the time to come back (0: now).
    pub wait: i64,
    /// Whether the booking was recorded as a reservation that a settle can cancel (a booking for later:
    /// `wait` > 0).
    pub recorded: bool,
}

/// Books `cost` tokens of the key of `target` (a token bucket's), first come first served: taken at once
/// down to `max_debt` tokens below zero and no further than `max_delay` µs of refill
/// ([`Policy::book`]); when the tokens exist only later, the booking is recorded in `reservation`'s bucket
/// (a fresh reservation's, held until the booked time: its numbers are set here), so that [`cancel`] can
/// free it before then. Overrides and blocks decide first, as for a
/// take (an exempt key is booked for now with nothing taken, a denied or blocked one is denied), and a
/// denial is counted in the policy's penalty box; the backend's memory of short buckets is not asked (a
/// bucket too short for a take may still book). Locks the key's bucket, then the reservation's.
pub fn book<S: Store>(
    s: &S,
    target: &Target<'_>,
    reservation: &Target<'_>,
    cost: i64,
    max_debt: i64,
    max_delay: i64,
) -> Result<Booked, S::Error> {
    let one = std::slice::from_ref(target);
    let blocked = blocks::blocked(s, one)?[0];
    let decided = match target.verdict {
        Some(v) => Some(v.outcome(&target.policy, s.now()?)),
        None => blocked,
    };
    let mut answers: PerTarget<Answer> = smallvec::smallvec![Answer {
        by_block: blocked.is_some(),
        ..Answer::not_looked_at()
    }];
    let mut booked = Booked {
        answer: answers[0],
        wait: 0,
        recorded: false,
    };
    match decided {
        // an override's answer, or a block (enforced, or reported in shadow mode): no bucket is touched
        Some(o) => answers[0].outcome = o,
        None => {
            let ask = Ask::Book {
                cost,
                max_debt,
                max_delay,
            };
            let o = s.write(target, ask)?;
            answers[0].outcome = o;
            if o.allowed {
                answers[0].memo = Memo::Forget;
                booked.wait = target.policy.booked_wait(o.state);
            }
        }
    }
    if booked.wait > 0 {
        let held = Policy::reservation(booked.wait.min(MAX_HOLD_US)).map(|policy| Target {
            policy,
            ..*reservation
        });
        if let Ok(r) = held {
            // as of the booking's instant: held until exactly its time
            let since = answers[0].outcome.state.at;
            let ask = Ask::Record {
                tokens: cost,
                since,
            };
            booked.recorded = s.write(&r, ask)?.allowed;
        }
    }
    blocks::count_denials(s, one, &mut answers)?;
    booked.answer = answers[0];
    Ok(booked)
}

/// Cancels the booking whose bucket is `booking` ([`book`]) of the key of `target`: if it is held (its
/// time has not come, not cancelled before), frees it and gives its tokens back to the key's bucket when
/// nothing was booked after them ([`Policy::cancel_booking`]). The key's bucket afterwards, and whether
/// this call cancelled the booking; a booking cancelled already, whose time has come, or unknown changes
/// nothing. Locks the booking's bucket, then the key's, as [`settle`] does (and for the same reason).
pub fn cancel<S: Store>(
    s: &S,
    target: &Target<'_>,
    booking: &Target<'_>,
) -> Result<(Answer, bool), S::Error> {
    let Some((tokens, time)) = free_held(s, booking)? else {
        return Ok((report(s, target)?, false));
    };
    if target.verdict.is_some() {
        return Ok((report(s, target)?, true));
    }
    let outcome = s.update(target, |stored, now| {
        let state = target.current(stored, now);
        let back = stored.and_then(|_| target.policy.cancel_booking(state, now, tokens, time));
        let outcome = target.policy.take(back.unwrap_or(state), now, 0);
        (back, outcome)
    })?;
    Ok((
        Answer {
            memo: Memo::Forget,
            ..Answer::of(outcome)
        },
        true,
    ))
}

/// The key of `target` as it is, writing nothing: its override's answer, or its bucket (a take of 0
/// tokens, which only reports).
fn report<S: Store>(s: &S, target: &Target<'_>) -> Result<Answer, S::Error> {
    let outcome = match target.verdict {
        Some(v) => v.outcome(&target.policy, s.now()?),
        None => s.take(std::slice::from_ref(target), &[0])?[0],
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
