//! Charges after the fact: [`Policy::charge`] takes a cost that is only known once the work is done (the
//! tokens an LLM call used, the bytes a response sent). A charge always takes. It may drive a bucket below
//! zero, into debt, down to `max_debt` tokens; what goes beyond that floor is forgiven. While a bucket is in
//! debt every take is denied, and its `retry_after` counts the debt: the bucket refills through it at the
//! policy's rate (token bucket, sliding window) or at the next window (fixed window, whose windows restore
//! everything).
//!
//! Debt is state the stores already keep. The token bucket's level goes negative (ticks); a window's count
//! goes above the limit (at most [`MAX_WINDOW_COUNT`] per window). Nothing else changes: refill, refunds,
//! carry-over and the purge of full buckets read a bucket in debt like any other shortfall.

use super::*;

/// Why a `max_debt` is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebtError {
    /// `max_debt` is negative.
    Negative,
    /// The debt cannot be counted exactly: `max_debt × period` ticks overflow (token bucket), or
    /// `burst + max_debt` is above [`MAX_WINDOW_COUNT`] (windows).
    TooLarge {
        /// The largest `max_debt` this policy can have.
        most: i64,
    },
}

impl fmt::Display for DebtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DebtError::Negative => f.write_str("max_debt must be 0 or more tokens"),
            DebtError::TooLarge { most } => {
                write!(
                    f,
                    "max_debt must be at most {most} tokens for these numbers"
                )
            }
        }
    }
}

impl Policy {
    /// The largest `max_debt` this policy can count exactly.
    pub fn most_debt(&self) -> i64 {
        match self.algorithm {
            Algorithm::TokenBucket => i64::MAX / self.period_us(),
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::CalendarWindow => {
                MAX_WINDOW_COUNT - self.burst()
            }
            Algorithm::Concurrency
            | Algorithm::Block
            | Algorithm::Reservation
            | Algorithm::AdaptiveLimit => 0,
        }
    }

    /// Checks a `max_debt` (in tokens) for this policy.
    pub fn check_max_debt(&self, max_debt: i64) -> Result<(), DebtError> {
        if max_debt < 0 {
            return Err(DebtError::Negative);
        }
        let most = self.most_debt();
        if max_debt > most {
            return Err(DebtError::TooLarge { most });
        }
        Ok(())
    }

    /// Charges `cost` (>= 0) tokens at `now`: always granted, down to `max_debt` tokens below zero (a valid
    /// one, see [`Policy::check_max_debt`]). A bucket already below that floor (the policy's `max_debt` was
    /// lowered) keeps its debt and gains none. The outcome is allowed, reports the bucket afterwards
    /// (`remaining` 0 while in debt) and `retry_after` `None`.
    pub fn charge(&self, state: State, now: i64, cost: i64, max_debt: i64) -> Outcome {
        let cost = cost.max(0);
        let max_debt = max_debt.clamp(0, self.most_debt().max(0));
        match self.algorithm {
            Algorithm::TokenBucket => {
                let current = bucket_of(state).refilled(&self.limit, now);
                let period = i128::from(self.period_us());
                let level = i128::from(current.level);
                let floor = (-i128::from(max_debt) * period).min(level);
                let after = (level - i128::from(cost) * period).max(floor);
                let after = Bucket {
                    level: after as i64, // between floor and level: both fit in i64
                    updated_at: current.updated_at,
                };
                self.token_bucket_outcome(true, after, None, now)
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let t = now;
                let (previous, current) = self.counts_at(state, t);
                let period = i128::from(self.period_us());
                // the most `current` may reach: weighted use at most (burst + max_debt) × period
                let ceiling = i128::from(self.burst() + max_debt) * period
                    - self.weighted_use(previous, 0, t);
                let most = (ceiling.div_euclid(period))
                    .clamp(i128::from(current), i128::from(MAX_WINDOW_COUNT))
                    as i64;
                let after = current.saturating_add(cost).min(most).max(current);
                self.window_outcome(true, previous, after, None, t)
            }
            Algorithm::CalendarWindow => self.charge_calendar(state, now, cost, max_debt),
            // leases are acquired, not charged: a charge reports the slot
            Algorithm::Concurrency => self.slot_outcome(state, now),
            Algorithm::Block => self.block_outcome(state, now),
            // a reservation is settled, not charged: a charge reports it
            Algorithm::Reservation => self.reservation_outcome(state, now),
            // a limit adapts to releases, it is not charged
            Algorithm::AdaptiveLimit => self.limit_outcome(state, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: i64 = 1_000_000;

    fn policy(algorithm: Algorithm, rate: i64, period: i64, burst: i64) -> Policy {
        Policy::new(algorithm, rate, period, burst).expect("valid test policy")
    }

    /// The LLM-token pattern: take an estimate, then charge what the call really used beyond it.
    #[test]
    fn a_charge_drives_a_token_bucket_into_debt_and_takes_wait_for_it() {
        // 100 tokens per second, burst 1000, max_debt 500
        let p = policy(Algorithm::TokenBucket, 100, S, 1000);
        let t0 = 10 * S;
        let estimate = p.take(p.full(t0), t0, 800);
        assert_eq!(estimate.remaining, 200);
        // the call used 1 500 tokens: 700 more than estimated; 200 are there, 500 go into debt
        let charged = p.charge(estimate.state, t0, 700, 500);
        assert!(charged.allowed);
        assert_eq!(charged.remaining, 0);
        assert_eq!(charged.retry_after, None);
        assert_eq!(p.tokens_millionths(charged.state, t0), -500_000_000);
        // 15 s to refill 1 500 tokens at 100/s
        assert_eq!(charged.reset_after, 15 * S);
        // a take of 1 waits for the debt and one token: 5.01 s
        let denied = p.take(charged.state, t0, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, Some(5 * S + S / 100));
        assert!(p.take(charged.state, t0 + 5 * S + S / 100, 1).allowed);
        // beyond the floor the cost is forgiven: the debt stays 500
        let more = p.charge(charged.state, t0, 10_000, 500);
        assert_eq!(p.tokens_millionths(more.state, t0), -500_000_000);
    }

    #[test]
    fn without_max_debt_a_charge_empties_the_bucket_at_most() {
        let p = policy(Algorithm::TokenBucket, 1, S, 10);
        let o = p.charge(p.full(0), 0, 25, 0);
        assert!(o.allowed);
        assert_eq!(o.state.level, 0);
        assert_eq!(o.reset_after, 10 * S);
    }

    #[test]
    fn a_bucket_below_a_lowered_floor_keeps_its_debt() {
        let p = policy(Algorithm::TokenBucket, 1, S, 10);
        let deep = p.charge(p.full(0), 0, 30, 20); // -20
        let o = p.charge(deep.state, 0, 5, 5);
        assert_eq!(o.state.level, -20 * S);
    }

    #[test]
    fn a_fixed_window_counts_its_debt_until_the_window_ends() {
        let p = policy(Algorithm::FixedWindow, 10, 60 * S, 10);
        let t = 600 * S + 5 * S; // 5 s into a window
        let o = p.charge(p.full(t), t, 14, 3);
        assert_eq!(o.state.level, 13); // 10 + 3 of debt, 1 forgiven
        assert_eq!(o.remaining, 0);
        assert_eq!(p.tokens_millionths(o.state, t), -3_000_000);
        let denied = p.take(o.state, t, 1);
        assert_eq!(denied.retry_after, Some(55 * S));
        assert!(p.take(o.state, 660 * S, 10).allowed);
    }

    #[test]
    fn a_sliding_window_refills_its_debt_as_the_window_slides() {
        let p = policy(Algorithm::SlidingWindow, 10, 10 * S, 10);
        let t = 100 * S; // a window start
        let o = p.charge(p.full(t), t, 15, 5); // 15 used: 5 of debt
        assert_eq!(p.tokens_millionths(o.state, t), -5_000_000);
        // at 110 s the 15 weigh fully, then lose 1.5 per second: 1 token at 114 s
        let denied = p.take(o.state, t, 1);
        assert_eq!(denied.retry_after, Some(14 * S));
        assert!(!p.take(o.state, 114 * S - 1, 1).allowed);
        assert!(p.take(o.state, 114 * S, 1).allowed);
    }

    #[test]
    fn max_debt_is_bounded_by_what_a_state_counts() {
        let tb = policy(Algorithm::TokenBucket, 1, 1_000 * S, 10);
        assert_eq!(tb.check_max_debt(-1), Err(DebtError::Negative));
        assert!(tb.check_max_debt(tb.most_debt()).is_ok());
        assert!(tb.check_max_debt(tb.most_debt() + 1).is_err());
        let w = policy(Algorithm::FixedWindow, 10, S, 10);
        assert_eq!(
            w.check_max_debt(MAX_WINDOW_COUNT),
            Err(DebtError::TooLarge {
                most: MAX_WINDOW_COUNT - 10
            })
        );
    }

    /// The exact model of a token bucket with debt: tokens as a rational, `rate / period` per µs, capped at
    /// burst, a take granted when tokens >= cost, a charge lowering to at least `-max_debt`.
    #[derive(Clone, Copy)]
    struct Exact {
        num: i128, // tokens × period
        at: i64,
    }

    proptest! {
        /// Any sequence of takes and charges at increasing instants decides exactly as the exact model,
        /// and the level never goes below `-max_debt`.
        #[test]
        fn takes_and_charges_match_the_exact_model(
            rate in 1i64..=50, period in 1i64..=3_000_000, burst in 1i64..=100,
            max_debt in 0i64..=200,
            calls in proptest::collection::vec((0i64..=2_000_000, 0i64..=150, any::<bool>()), 1..60),
        ) {
            let p = policy(Algorithm::TokenBucket, rate, period, burst);
            let full = i128::from(burst) * i128::from(period);
            let mut exact = Exact { num: full, at: 0 };
            let mut state = p.full(0);
            let mut now = 0i64;
            for (gap, cost, is_charge) in calls {
                now += gap;
                let refilled = (exact.num + i128::from(rate) * i128::from(now - exact.at)).min(full);
                exact = Exact { num: refilled, at: now };
                let need = i128::from(cost) * i128::from(period);
                let o = if is_charge {
                    let floor = (-i128::from(max_debt) * i128::from(period)).min(exact.num);
                    exact.num = (exact.num - need).max(floor);
                    p.charge(state, now, cost, max_debt)
                } else {
                    let granted = cost == 0 || exact.num >= need; // cost 0 only reports
                    if granted {
                        exact.num -= need;
                    }
                    let o = p.take(state, now, cost);
                    prop_assert_eq!(o.allowed, granted);
                    o
                };
                if o.allowed {
                    state = o.state;
                }
                prop_assert_eq!(p.tokens_exact(state, now).0, exact.num);
                prop_assert!(exact.num >= -i128::from(max_debt) * i128::from(period));
                prop_assert_eq!(o.remaining, (exact.num / i128::from(period)).max(0) as i64);
            }
        }

        /// A charge on a window never counts more than `burst + max_debt` in weighted use (nor fewer than
        /// the bucket already had), and a window bucket in debt denies every take.
        #[test]
        fn window_charges_stay_within_the_debt(
            sliding in any::<bool>(), rate in 1i64..=100, period in 1i64..=1_000_000,
            max_debt in 0i64..=100, cost in 0i64..=400, first in 0i64..=400,
            at in 0i64..=10_000_000, later in 0i64..=2_000_000,
        ) {
            let algorithm = if sliding { Algorithm::SlidingWindow } else { Algorithm::FixedWindow };
            let p = policy(algorithm, rate, period, rate);
            let s1 = p.charge(p.full(at), at, first, max_debt).state;
            let t = at + later;
            let before = p.tokens_exact(s1, t);
            let o = p.charge(s1, t, cost, max_debt);
            let after = p.tokens_exact(o.state, t);
            prop_assert!(after.0 <= before.0);
            prop_assert!(after.0 >= (-i128::from(max_debt) * after.1).min(before.0));
            if after.0 < 0 {
                prop_assert!(!p.take(o.state, t, 1).allowed);
            }
        }
    }
}
