//! Booked slots: a token bucket's tokens booked in order, first come first served, so that a caller short
//! of tokens is told when to come back instead of being denied (and sleeps off the connection), as Go's
//! `rate.Limiter.Reserve` does. A booking takes its tokens at once, driving the level below zero down to the
//! policy's `max_debt`; the level's deficit after a booking is exactly what the refill must make up before
//! the booked tokens exist, so the booking's wait is that deficit at the policy's rate. Each booking after it
//! deepens the deficit by its own cost, so successive bookings get strictly later times, each a booking's
//! cost apart at the rate: the slots never overlap and together honour the rate. A take waits behind every
//! booking (the bucket in debt denies it), so nobody jumps the queue.
//!
//! A booking for later is recorded like a reservation (`reservation`), in a bucket of its own named
//! [`booking_namespace`], held until the booking's time, so that it can be cancelled before then, once.
//! A cancel gives the booking's tokens back only when nothing was booked after them (the bucket is out of
//! debt by the booking's time): giving back tokens that later bookings wait behind would move the end of
//! the queue before times already given out, and a booking made next would share a slot with one of them.
//! A booking in the middle of the queue cancelled frees its slot to nobody; once its time has come it has
//! been used and cannot be cancelled.

use super::token_bucket::Bucket;
use super::*;

/// What a booking decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Booking {
    /// The bucket's outcome: allowed when booked (its state written), denied with the time until a booking
    /// of that cost would fit (`retry_after`; `None` when it never can).
    pub outcome: Outcome,
    /// When booked: microseconds until the booked tokens exist (0: now).
    pub wait: i64,
}

/// The namespace of the bucket of booking `id` of policy `policy`'s keys: the policy's name, U+001F,
/// `booking` and the id. No policy is called that (policy names are printable ASCII), nor any other bucket
/// beside a key's (a reservation's, a lease slot's, a block's).
pub fn booking_namespace(policy: &str, id: i64) -> String {
    crate::target::policy_part(policy, &format!("booking {id}"))
}

impl Policy {
    /// Books `cost` (>= 1) tokens at `now`, down to `max_debt` tokens below zero (a valid one, see
    /// [`Policy::check_max_debt`]) and no further than the caller waits: `max_delay_us` microseconds
    /// (`i64::MAX`: as long as the debt allows). `None` for any algorithm but the token bucket, whose
    /// continuous refill is what makes a time to come back exact.
    pub fn book(
        &self,
        state: State,
        now: i64,
        cost: i64,
        max_debt: i64,
        max_delay_us: i64,
    ) -> Option<Booking> {
        if self.algorithm != Algorithm::TokenBucket {
            return None;
        }
        let limit = &self.limit;
        let current = bucket_of(state).refilled(limit, now);
        let period = i128::from(self.period_us());
        let rate = i128::from(self.rate());
        // the deepest level a booking may leave, in ticks: the policy's debt, and what the refill makes up
        // within the caller's delay
        let by_debt = i128::from(max_debt.clamp(0, self.most_debt().max(0))) * period;
        let by_delay = i128::from(max_delay_us.max(0)) * rate;
        let floor = -by_debt.min(by_delay);
        let level = i128::from(current.level);
        let after = level - i128::from(cost.max(1)) * period;
        if after >= floor {
            let booked = Bucket {
                level: after as i64, // between floor and level: both fit in i64
                updated_at: current.updated_at,
            };
            let outcome = self.token_bucket_outcome(true, booked, None, now);
            return Some(Booking {
                outcome,
                wait: self.booked_wait(outcome.state),
            });
        }
        // the level a booking of `cost` needs is floor + cost: reached by refill if it is within the capacity
        let needed = floor + i128::from(cost.max(1)) * period;
        let retry_after = (needed <= i128::from(limit.full_level()))
            .then(|| i64::try_from(ceil_div(needed - level, rate)).unwrap_or(i64::MAX));
        Some(Booking {
            outcome: self.token_bucket_outcome(false, current, retry_after, now),
            wait: 0,
        })
    }

    /// Microseconds after `state.at` until a token bucket left at `state` by a booking is out of debt: when
    /// the last tokens booked exist (0 when the bucket is not in debt).
    pub fn booked_wait(&self, state: State) -> i64 {
        if state.level >= 0 {
            return 0;
        }
        let rate = i128::from(self.rate().max(1));
        i64::try_from(ceil_div(-i128::from(state.level), rate)).unwrap_or(i64::MAX)
    }
}

impl Policy {
    /// Cancels a booking of `tokens` whose tokens exist at `time`, in the token bucket `state` at `now`:
    /// the bucket with the tokens back (never above its capacity) when nothing was booked after them (the
    /// bucket is out of debt by `time`), `None` when later bookings wait behind them (nothing changes).
    pub fn cancel_booking(&self, state: State, now: i64, tokens: i64, time: i64) -> Option<State> {
        let end = state.at.saturating_add(self.booked_wait(state));
        (end <= time).then(|| self.refund(state, now, tokens))
    }
}

/// `n / d` rounded up, for `n >= 0` and `d > 0`.
fn ceil_div(n: i128, d: i128) -> i128 {
    (n + d - 1).div_euclid(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: i64 = 1_000_000;

    fn policy(rate: i64, period: i64, burst: i64) -> Policy {
        Policy::new(Algorithm::TokenBucket, rate, period, burst).expect("valid test policy")
    }

    #[test]
    fn bookings_queue_at_the_rate_and_a_take_waits_behind_them() {
        // 2 tokens a second, burst 2, up to 10 tokens of bookings ahead
        let p = policy(2, S, 2);
        let t0 = 100 * S;
        let mut state = p.full(t0);
        let mut waits = Vec::new();
        for _ in 0..12 {
            let b = p.book(state, t0, 1, 10, i64::MAX).expect("a token bucket");
            assert!(b.outcome.allowed);
            state = b.outcome.state;
            waits.push(b.wait);
        }
        // the burst now, then one every half second
        assert_eq!(
            waits,
            [
                0,
                0,
                S / 2,
                S,
                3 * S / 2,
                2 * S,
                5 * S / 2,
                3 * S,
                7 * S / 2,
                4 * S,
                9 * S / 2,
                5 * S
            ]
        );
        // 10 tokens booked ahead: the next booking waits until one more fits
        let refused = p.book(state, t0, 1, 10, i64::MAX).expect("a token bucket");
        assert!(!refused.outcome.allowed);
        assert_eq!(refused.outcome.retry_after, Some(S / 2));
        // a take waits behind every booking: the bucket holds a token again only after the last one's time
        assert!(!p.take(state, t0 + 5 * S - 1, 1).allowed);
        assert!(p.take(state, t0 + 5 * S + S / 2, 1).allowed);
        // a cost beyond burst + max_debt can never be booked
        assert_eq!(
            p.book(p.full(t0), t0, 13, 10, i64::MAX)
                .expect("tb")
                .outcome
                .retry_after,
            None
        );
        // a caller that waits at most a second gets the burst and the next two half-second slots
        let mut state = p.full(t0);
        let mut waits = Vec::new();
        loop {
            let b = p.book(state, t0, 1, 10, S).expect("a token bucket");
            if !b.outcome.allowed {
                // the next slot is 1.5 s away: it fits a 1 s delay half a second from now
                assert_eq!(b.outcome.retry_after, Some(S / 2));
                break;
            }
            state = b.outcome.state;
            waits.push(b.wait);
        }
        assert_eq!(waits, [0, 0, S / 2, S]);
        // other algorithms do not book
        let w = Policy::new(Algorithm::FixedWindow, 2, S, 2).expect("valid");
        assert_eq!(w.book(w.full(t0), t0, 1, 0, i64::MAX), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Bookings made one after another (at instants that move forward) get times that strictly
        /// increase and never overlap: each booking's tokens exist, by refill alone, exactly at its time
        /// (exact: the level in ticks), and not a microsecond before.
        #[test]
        fn booked_times_increase_and_each_is_exactly_when_its_tokens_exist(
            rate in 1i64..50,
            period in 1i64..5_000_000,
            burst in 1i64..20,
            max_debt in 0i64..200,
            max_delay in 0i64..20_000_000,
            calls in prop::collection::vec((0i64..3_000_000, 1i64..5), 1..40),
        ) {
            let p = policy(rate, period, burst);
            let mut now = 1_000 * S;
            let mut state = p.full(now);
            let mut last_time: Option<i64> = None;
            for (gap, cost) in calls {
                now += gap;
                let b = p.book(state, now, cost, max_debt, max_delay).expect("a token bucket");
                if !b.outcome.allowed {
                    continue;
                }
                state = b.outcome.state;
                prop_assert!(b.wait <= max_delay, "no booking waits longer than its caller would");
                prop_assert_eq!(b.wait, p.booked_wait(state));
                let time = now + b.wait;
                if let Some(last) = last_time {
                    prop_assert!(time >= last, "a later booking never comes before an earlier one");
                }
                // refill alone brings the level to zero exactly at `time`
                let at_time = token_bucket::Bucket { level: state.level, updated_at: state.at };
                let limit = token_bucket::Limit::new(rate, period, burst).expect("valid");
                prop_assert!(at_time.level_at(&limit, time) >= 0);
                if b.wait > 0 {
                    prop_assert!(at_time.level_at(&limit, time - 1) < 0);
                }
                last_time = Some(time);
            }
        }
    }
}
