//! Booked slots: `book` takes a token bucket's tokens ahead of time, first come first served, and says
//! when they exist, so that a caller short of tokens sleeps off its connection and comes back then instead
//! of being denied or waiting inside the backend (`wait`); `cancel_booking` gives up a booking before its
//! time. Any role may call both, as it may `take`: how far ahead a key's tokens can be booked is the
//! policy owner's `max_debt`, and a cancel needs the booking's id, which only the `book` that made it
//! returned (see [`rate_limit_model::algorithm::booking`]).

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use super::family::no_parent;
use super::leases::random_bits;
use super::reservations::{held_bucket, tokens_arg};
use super::{combine, key_arg, policy_arg, policy_target, store_of, to_row};
use crate::error;
use crate::policies::Named;
use crate::store;
use rate_limit_model::algorithm::{booking_namespace, Algorithm, MAX_HOLD_US};

/// 42809 for a policy that cannot book: any algorithm but the token bucket.
fn not_bookable(function: &'static str, named: &Named) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        format!(
            "policy {} is a {} policy: only a token bucket books tokens ahead",
            error::quoted(&named.name),
            named.policy.algorithm().name()
        ),
        function,
    )
    .set_hint(
        "Book under a policy created with algorithm => 'token_bucket' (or 'gcra'), whose steady refill \
         gives every booking an exact time.",
    )
}

/// How long a caller waits at most, in microseconds: not NULL (22004), no months, 0 to 1 day (22023).
fn max_delay_us(function: &'static str, max_delay: Option<Interval>) -> Result<i64, ErrorReport> {
    let hint =
        "Pass how long the caller is ready to wait for its tokens, from interval '0' (only tokens \
                that exist now) to interval '1 day'.";
    let max_delay = max_delay.ok_or_else(|| error::null_argument(function, "max_delay", hint))?;
    let us = i64::try_from(max_delay.as_micros()).unwrap_or(i64::MAX);
    if max_delay.months() != 0 || !(0..=MAX_HOLD_US).contains(&us) {
        return Err(error::invalid_value(
            function,
            "max_delay must be between 0 and 1 day, without months".to_string(),
            hint,
        ));
    }
    Ok(us)
}

/// Booked slots, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Books `cost` tokens of `key` under `policy` (a token bucket's), first come first served: when the
    /// bucket holds them they are taken now, otherwise they are taken ahead, down to the policy's
    /// `max_debt` below zero and no further than the caller waits (`max_delay`). Allowed: `retry_after` is
    /// when the booked tokens exist (0: now), the time to come back, and `lease` the booking's id (NULL
    /// for a booking for now) for `rate_limit.cancel_booking`. Denied: `retry_after` is when a booking
    /// of `cost` would fit within `max_delay` (NULL: never). In the table store a booking made in a
    /// transaction that rolls back is undone.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn book(
        policy: Option<&str>,
        key: Option<&str>,
        cost: default!(Option<i64>, 1),
        max_delay: default!(Option<Interval>, "'1 day'::interval"),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.book";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let cost = tokens_arg(
            F,
            "cost",
            cost,
            1,
            "Pass the tokens to book, 1 or more (at most the burst plus the policy's max_debt).",
        )?;
        let max_delay = max_delay_us(F, max_delay)?;
        if named.policy.algorithm() != Algorithm::TokenBucket {
            return Err(not_bookable(F, &named));
        }
        no_parent(F, &named, "book")?;
        let t = policy_target(F, &named, key)?;
        // 62 random bits, plus 1: positive, never 0
        let id = i64::try_from(random_bits(F)? >> 2).unwrap_or(0) + 1;
        let name = booking_namespace(&named.name, id);
        let b = held_bucket(F, &t, &name, 1)?;
        let store = store_of(Some(&named));
        let booked = store::book(F, store, &t, &b, cost, named.max_debt, max_delay)?;
        let mut d = combine(&[t], &[booked.answer.outcome]);
        if booked.answer.outcome.allowed {
            d.retry_after = Some(booked.wait);
        }
        d.lease = booked.recorded.then_some(id);
        to_row(F, &d)
    }

    /// Cancels booking `booking` of `key` under `policy` before its time: its tokens go back into the
    /// key's bucket when nothing was booked after them (otherwise its slot passes unused: giving them back
    /// would let the next booking share a time given out already). Returns the key's bucket afterwards;
    /// `allowed` is true if this call cancelled the booking, false if it was cancelled already, its time
    /// has come, or it is not this key's, and nothing changed.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn cancel_booking(
        policy: Option<&str>,
        key: Option<&str>,
        booking: Option<i64>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.cancel_booking";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let booking = booking.ok_or_else(|| {
            error::null_argument(
                F,
                "booking",
                "Pass the id that rate_limit.book returned in its lease field.",
            )
        })?;
        let t = policy_target(F, &named, key)?;
        let name = booking_namespace(&named.name, booking);
        let b = held_bucket(F, &t, &name, 1)?;
        let (outcome, cancelled) = store::cancel(F, store_of(Some(&named)), &t, &b)?;
        let mut d = combine(&[t], &[outcome]);
        d.allowed = cancelled;
        d.lease = cancelled.then_some(booking);
        to_row(F, &d)
    }
}
