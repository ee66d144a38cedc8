//! Reservations: tokens taken on an estimate (`rate_limit.reserve`) and settled later on what the work
//! really used (`rate_limit.settle`): what was reserved and not used goes back into the key's bucket, what
//! was used beyond it is charged as debt ([`Policy::charge`]).
//!
//! A reservation lives in a bucket of its own beside its key's bucket: namespace [`reservation_namespace`]
//! (the policy's name, U+001F, `reservation` and the reservation's id) and the caller's key, so it sits
//! where the key's other buckets do (the same Citus shard, the same database's share of the memory store).
//! Its numbers ([`Policy::reservation`]) are algorithm [`Algorithm::Reservation`], `rate` = `burst` = 1 and
//! `period_us` = the hold, how long it waits to be settled. Its state is
//!
//! | `level` | meaning                                     | `at`                   |
//! | ------- | ------------------------------------------- | ---------------------- |
//! | `> 0`   | the tokens reserved, not yet settled        | when they were reserved |
//! | `0`     | settled (or never reserved): the bucket is full | when it was settled   |
//!
//! A reservation is held from `at` until `at + period_us`; after that it has expired, settled at its
//! estimate (the tokens stay taken), and its bucket is full: a store deletes it as it deletes any full
//! bucket. A settle therefore gives back at most what its reservation took, once: the first settle of an
//! unexpired reservation frees it ([`Policy::settle_slot`]), and any later one finds nothing to settle.
//! Time is measured from `at`: a clock read before `at` counts as no time elapsed.

use super::*;

/// The longest hold of a reservation, in microseconds: one day. A reservation is a bucket a caller makes
/// the store keep until it is settled or expires; this bounds how long an unsettled one is kept.
pub const MAX_HOLD_US: i64 = 86_400 * 1_000_000;

/// The namespace of the bucket of reservation `id` of policy `policy`'s keys: the policy's name, U+001F,
/// `reservation` and the id. No policy is called that (policy names are printable ASCII), nor any lease
/// slot (theirs are a number) or block bucket.
pub fn reservation_namespace(policy: &str, id: i64) -> String {
    crate::target::policy_part(policy, &format!("reservation {id}"))
}

impl Policy {
    /// The numbers of the bucket of a reservation held for `hold_us` microseconds (at least 1, at most
    /// [`MAX_HOLD_US`]).
    pub fn reservation(hold_us: i64) -> Result<Policy, PolicyError> {
        Policy::new(Algorithm::Reservation, 1, hold_us, 1)
    }

    /// When the reservation of `state` expires.
    pub fn reservation_expiry(&self, state: State) -> i64 {
        state.at.saturating_add(self.period_us())
    }

    /// Whether `state` holds an unsettled, unexpired reservation at `now`.
    pub fn reservation_held(&self, state: State, now: i64) -> bool {
        state.level > 0 && now.max(state.at) < self.reservation_expiry(state)
    }

    /// Reserves `tokens` (> 0) in the bucket `state` at `now`: granted unless the bucket holds a
    /// reservation already (a reservation's id is fresh, so only a bug could ask twice). `tokens` 0 only
    /// reports.
    pub(super) fn take_reservation(&self, state: State, now: i64, tokens: i64) -> Outcome {
        if tokens <= 0 || self.reservation_held(state, now) {
            return Outcome {
                allowed: tokens <= 0,
                ..self.reservation_outcome(state, now)
            };
        }
        self.reservation_outcome(
            State {
                level: tokens,
                at: now,
            },
            now,
        )
    }

    /// Settles the reservation of `state` at `now`: the bucket's new state (free) and the tokens it held,
    /// or `None` when it holds none (settled already, expired, or never reserved).
    pub fn settle_slot(&self, state: State, now: i64) -> Option<(State, i64)> {
        self.reservation_held(state, now)
            .then_some((State { level: 0, at: now }, state.level))
    }

    /// A reservation's bucket reported: while held, `remaining` the tokens it holds and `reset_after` the
    /// time until it expires; free, a full bucket (allowed, nothing remaining, nothing to wait for).
    pub(super) fn reservation_outcome(&self, state: State, now: i64) -> Outcome {
        let held = self.reservation_held(state, now);
        Outcome {
            allowed: true,
            state: if held {
                state
            } else {
                State { level: 0, at: now }
            },
            remaining: if held { state.level } else { 0 },
            retry_after: None,
            reset_after: if held {
                until(self.reservation_expiry(state).into(), now)
            } else {
                0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn a_reservation_is_held_until_settled_once_or_expired() {
        let p = Policy::reservation(10 * S).expect("hold");
        let free = p.full(0);
        assert!(p.is_full(free, 0));
        let reserved = p.take(free, 5, 300);
        assert!(reserved.allowed);
        assert_eq!(reserved.state, State { level: 300, at: 5 });
        assert_eq!(reserved.remaining, 300);
        assert_eq!(reserved.reset_after, 10 * S);
        assert!(!p.is_full(reserved.state, 5));
        // a second reservation in the same bucket is refused, and changes nothing
        let again = p.take(reserved.state, 6, 7);
        assert!(!again.allowed);
        assert_eq!(again.state, reserved.state);
        // settled once: its tokens, and the bucket is free (full)
        let (settled, tokens) = p.settle_slot(reserved.state, 2 * S).expect("held");
        assert_eq!(tokens, 300);
        assert!(p.is_full(settled, 2 * S));
        assert_eq!(p.settle_slot(settled, 2 * S + 1), None);
        // unsettled, it expires at its hold's end: nothing left to settle
        assert!(p.settle_slot(reserved.state, 10 * S + 4).is_some());
        assert_eq!(p.settle_slot(reserved.state, 10 * S + 5), None);
        assert!(p.is_full(reserved.state, 10 * S + 5));
        // a clock read before the reservation counts as no time elapsed
        assert!(p.settle_slot(reserved.state, 0).is_some());
    }

    #[test]
    fn a_reservation_gives_nothing_to_charges_or_refunds_and_keeps_its_expiry_under_new_numbers() {
        let p = Policy::reservation(10 * S).expect("hold");
        let held = State { level: 40, at: S };
        assert_eq!(p.refund(held, 2 * S, 1000), held);
        assert_eq!(p.charge(held, 2 * S, 1000, 0).state, held);
        // settle does not know the hold: read under other numbers, the reservation expires when it did
        let other = Policy::reservation(1).expect("hold");
        let carried = other.carry_over(held, &p, 0, 2 * S);
        assert_eq!(other.reservation_expiry(carried), 11 * S);
        assert_eq!(carried.level, 40);
        assert_eq!(other.settle_slot(carried, 2 * S).map(|(_, t)| t), Some(40));
        assert!(other.is_full(other.carry_over(held, &p, 0, 11 * S), 11 * S));
    }

    #[test]
    fn holds_are_bounded_and_namespaces_apart() {
        assert!(Policy::reservation(0).is_err());
        assert!(Policy::reservation(MAX_HOLD_US).is_ok());
        assert_eq!(reservation_namespace("llm", 42), "llm\u{1f}reservation 42");
        assert_ne!(reservation_namespace("llm", 42), block_namespace("llm"));
    }
}
