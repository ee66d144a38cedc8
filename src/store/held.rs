//! The calls that hold tokens for later, each a bucket beside its key's: reservations (`reserve`,
//! `reserve_many`, settled by `settle`, `settle_many`) and bookings (`book`, `cancel`), over the model's
//! pipeline ([`pipeline::single`]) in either store.

use pgrx::pg_sys::panic::ErrorReport;

use super::buckets::{with_store, Buckets};
use super::{apply, remember, settles, short, Seam};
use crate::gucs::Store;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::pipeline::{self, Answer, PerTarget};
use rate_limit_model::target::Target;

/// Reserves `estimate` tokens of the key of `target` (a named policy's bucket) as [`take`] would, and
/// records them in the bucket of `reservation`, a fresh reservation's ([`pipeline::single::reserve`]):
/// the key's outcome, and whether a reservation was recorded (none for a denial, an exempt key or a
/// would-be denial in shadow mode, which took nothing). Counted in the statistics as a take of `estimate`.
/// The table store writes both in the caller's transaction (a ROLLBACK undoes the reservation and its
/// take); the memory store at once.
pub fn reserve(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    reservation: &Target<'_>,
    estimate: i64,
) -> Result<(Outcome, bool), ErrorReport> {
    let one = std::slice::from_ref(target);
    let (answer, recorded) = with_store!(store, s => {
        // before this backend's memory answers for a bucket that may not be this node's
        s.ensure_here(function, one)?;
        let remembered = short::remembered(store);
        pipeline::single::reserve(&Seam { s, function }, remembered, target, reservation, estimate)
    })?;
    apply(store, one, &[answer], &[estimate]);
    Ok((answer.outcome, recorded))
}

/// Reserves `estimates[i]` tokens of `targets[i]`, every target, all or nothing, recording each in its
/// bucket `reservations[i]` ([`pipeline::single::reserve_many`]): each target's outcome, and whether a
/// reservation was recorded. Counted in the statistics as a take of each estimate. The table store writes
/// in the caller's transaction (a ROLLBACK undoes the reservation); the memory store at once.
pub fn reserve_many(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    reservations: &[Target<'_>],
    estimates: &[i64],
) -> Result<(PerTarget<Outcome>, bool), ErrorReport> {
    let (answers, recorded) = with_store!(store, s => {
        s.ensure_here(function, targets)?;
        let remembered = short::remembered(store);
        pipeline::single::reserve_many(&Seam { s, function }, remembered, targets, reservations, estimates)
    })?;
    Ok((apply(store, targets, &answers, estimates), recorded))
}

/// Settles the reservation whose bucket is `reservation` on `actual` tokens used by the key of `target`
/// ([`pipeline::single::settle`]): what was reserved and not used goes back into the key's bucket, what
/// was used beyond it is charged down to `max_debt` tokens of debt. The key's bucket afterwards, and
/// whether this call settled the reservation (false: settled already, expired, or unknown; nothing
/// changed). Not counted in the statistics (the reserve was). The table store writes in the caller's
/// transaction (a ROLLBACK undoes the settle, which a later one can then make); the memory store applies
/// it when the transaction commits ([`settles`]) and answers now what it will do.
pub fn settle(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    reservation: &Target<'_>,
    actual: i64,
    max_debt: i64,
) -> Result<(Outcome, bool), ErrorReport> {
    if store == Store::Memory {
        // answered now, applied at commit ([`settles`])
        let settled_before = settles::waiting(reservation);
        let (answer, held) = with_store!(store, s => pipeline::single::settle_preview(
            &Seam { s, function }, target, reservation, actual, max_debt, settled_before))?;
        if held {
            settles::defer(target, reservation, actual, max_debt);
        }
        return Ok((answer.outcome, held));
    }
    let (answer, settled) = with_store!(store, s => pipeline::single::settle(
        &Seam { s, function }, target, reservation, actual, max_debt))?;
    remember(
        store,
        std::slice::from_ref(target),
        std::slice::from_ref(&answer),
    );
    Ok((answer.outcome, settled))
}

/// Settles one reservation id under several policies of one key ([`pipeline::single::settle_many`]):
/// `reservations[i]` on `actuals[i]` tokens used by the key of `targets[i]`, down to `max_debts[i]` of
/// debt, the targets in the lock order. Each key's bucket afterwards, and whether this call settled its
/// reservation. The table store frees every reservation first, then refunds or charges every key, in the
/// caller's transaction; the memory store applies each settle when the transaction commits, as [`settle`].
pub fn settle_many(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    reservations: &[Target<'_>],
    actuals: &[i64],
    max_debts: &[i64],
) -> Result<Vec<(Outcome, bool)>, ErrorReport> {
    if store == Store::Memory {
        let mut settled = Vec::with_capacity(targets.len());
        for (((t, r), actual), max_debt) in
            targets.iter().zip(reservations).zip(actuals).zip(max_debts)
        {
            settled.push(settle(function, store, t, r, *actual, *max_debt)?);
        }
        return Ok(settled);
    }
    let settled = with_store!(store, s => pipeline::single::settle_many(
        &Seam { s, function }, targets, reservations, actuals, max_debts))?;
    let answers: Vec<Answer> = settled.iter().map(|(a, _)| *a).collect();
    remember(store, targets, &answers);
    Ok(settled.iter().map(|(a, done)| (a.outcome, *done)).collect())
}

/// Books `cost` tokens of the key of `target` (a token bucket policy's) first come first served, down to
/// `max_debt` tokens of debt and no further than `max_delay` µs ahead, recording a booking for later in
/// the bucket `booking` ([`pipeline::single::book`]): what the call did (the key's answer, the wait until
/// the booked tokens exist, whether a booking was recorded). Counted in the statistics as a take of
/// `cost`. The table store writes in the caller's transaction (a ROLLBACK undoes the booking); the memory
/// store at once.
pub fn book(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    booking: &Target<'_>,
    cost: i64,
    max_debt: i64,
    max_delay: i64,
) -> Result<pipeline::single::Booked, ErrorReport> {
    let one = std::slice::from_ref(target);
    let booked = with_store!(store, s => {
        s.ensure_here(function, one)?;
        pipeline::single::book(&Seam { s, function }, target, booking, cost, max_debt, max_delay)
    })?;
    apply(store, one, &[booked.answer], &[cost]);
    Ok(booked)
}

/// Cancels the booking whose bucket is `booking` of the key of `target` ([`pipeline::single::cancel`]):
/// the key's bucket afterwards, and whether this call cancelled it (false: cancelled already, its time
/// has come, or unknown; nothing changed). Not counted in the statistics (the booking was). The table
/// store writes in the caller's transaction (a ROLLBACK undoes the cancel); the memory store at once.
pub fn cancel(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    booking: &Target<'_>,
) -> Result<(Outcome, bool), ErrorReport> {
    let (answer, cancelled) = with_store!(store, s => pipeline::single::cancel(
        &Seam { s, function }, target, booking))?;
    remember(
        store,
        std::slice::from_ref(target),
        std::slice::from_ref(&answer),
    );
    Ok((answer.outcome, cancelled))
}
