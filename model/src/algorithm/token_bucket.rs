//! The exact token-bucket arithmetic, shared by every store.
//!
//! A limit grants `rate` tokens every `period_us` microseconds and holds at most `burst` tokens. To stay
//! exact, a bucket's level is kept in *ticks*: one token is `period_us` ticks, so the refill over `elapsed`
//! microseconds is exactly `rate × elapsed` ticks. Nothing is ever rounded except the whole-token count
//! reported to the caller (`floor`), so partial refill is never lost, however often a client calls.
//!
//! Intermediate products are computed in `i128` and compared before they are narrowed, so no input (a huge
//! gap of time, a timestamp at either end of `i64`, a corrupt stored level) can overflow. A clock that moves
//! backwards counts as no time elapsed and never grants tokens; the bucket is rebased on the new time, so
//! refill resumes at the limit's rate from the step (no freeze until the clock catches up).
//!
//! This module is plain Rust: it knows nothing of PostgreSQL, so it is unit- and property-tested with
//! `cargo test`.

use std::fmt;

/// Microseconds in one second: the period of every `rate_limiting_request` limit.
pub const MICROS_PER_SECOND: i64 = 1_000_000;

/// A level in millionths of a token as an exact decimal, e.g. `1500000` → `"1.500000"`, `-250000` →
/// `"-0.250000"` (a bucket in debt).
pub fn millionths_to_decimal(level: i64) -> String {
    let sign = if level < 0 { "-" } else { "" };
    let magnitude = level.unsigned_abs();
    let per = MICROS_PER_SECOND as u64;
    format!("{sign}{}.{:06}", magnitude / per, magnitude % per)
}

/// Why a limit cannot be represented exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// `rate` must be at least 1.
    RateNotPositive,
    /// `period_us` must be at least 1.
    PeriodNotPositive,
    /// `burst` must be at least 1.
    BurstNotPositive,
    /// `burst × period_us` ticks do not fit in an `i64`.
    TooLarge,
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            LimitError::RateNotPositive => "the refill rate must be at least 1",
            LimitError::PeriodNotPositive => "the refill period must be at least 1 microsecond",
            LimitError::BurstNotPositive => "the capacity must be at least 1",
            LimitError::TooLarge => "capacity × period is too large to count exactly",
        };
        f.write_str(text)
    }
}

/// A validated limit: `rate` tokens every `period_us` microseconds, at most `burst` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    rate: i64,
    period_us: i64,
    burst: i64,
    full: i64,
}

impl Limit {
    /// Builds a limit, refusing values that are not positive or whose full level overflows `i64` ticks.
    pub fn new(rate: i64, period_us: i64, burst: i64) -> Result<Limit, LimitError> {
        if rate < 1 {
            return Err(LimitError::RateNotPositive);
        }
        if period_us < 1 {
            return Err(LimitError::PeriodNotPositive);
        }
        if burst < 1 {
            return Err(LimitError::BurstNotPositive);
        }
        let full = burst.checked_mul(period_us).ok_or(LimitError::TooLarge)?;
        Ok(Limit {
            rate,
            period_us,
            burst,
            full,
        })
    }

    /// The limit of `rate_limiting_request(id, refill_per_sec, window_seconds)`: `refill_per_sec` tokens per
    /// second and a capacity of `refill_per_sec × window_seconds` tokens.
    pub fn per_second(refill_per_sec: i64, window_seconds: i64) -> Result<Limit, LimitError> {
        if refill_per_sec < 1 {
            return Err(LimitError::RateNotPositive);
        }
        if window_seconds < 1 {
            return Err(LimitError::PeriodNotPositive);
        }
        let burst = refill_per_sec
            .checked_mul(window_seconds)
            .ok_or(LimitError::TooLarge)?;
        Limit::new(refill_per_sec, MICROS_PER_SECOND, burst)
    }

    /// Tokens added per period.
    pub fn rate(&self) -> i64 {
        self.rate
    }

    /// The refill period in microseconds.
    pub fn period_us(&self) -> i64 {
        self.period_us
    }

    /// The capacity in whole tokens.
    pub fn burst(&self) -> i64 {
        self.burst
    }

    /// The capacity in ticks (`burst × period_us`).
    pub fn full_level(&self) -> i64 {
        self.full
    }

    /// Ticks in one token.
    pub fn ticks_per_token(&self) -> i64 {
        self.period_us
    }
}

/// The stored state of one bucket: its level in ticks at the instant `updated_at` (microseconds on the
/// server's clock). A bucket that does not exist is a full one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Level in ticks (see the module comment) at `updated_at`.
    pub level: i64,
    /// When `level` was computed, in microseconds.
    pub updated_at: i64,
}

/// What a request for tokens decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// The tokens were taken: store `bucket`; `remaining` whole tokens are left.
    Granted { bucket: Bucket, remaining: i64 },
    /// Not enough tokens: nothing changes (the stored state stays valid, refill being a function of time).
    Denied { available: i64 },
}

impl Bucket {
    /// A full bucket at `now`: the state of a key never seen before.
    pub fn full(limit: &Limit, now: i64) -> Bucket {
        Bucket {
            level: limit.full,
            updated_at: now,
        }
    }

    /// The level in ticks at `now`: the stored level plus `rate` ticks per elapsed microsecond, never more
    /// than full. A `now` before `updated_at` (a clock step backwards) adds nothing. A negative level is a
    /// debt (left by a charge, see [`super::Policy::charge`]), refilled like any other shortfall.
    pub fn level_at(&self, limit: &Limit, now: i64) -> i64 {
        let full = i128::from(limit.full);
        let level = i128::from(self.level).min(full);
        let elapsed = (i128::from(now) - i128::from(self.updated_at)).max(0);
        let refilled = level + i128::from(limit.rate) * elapsed;
        // `refilled` cannot overflow i128 (i64 × i64 fits), and the result is at most `full`, an i64.
        refilled.min(full) as i64
    }

    /// The state at `now`, refilled. When `now` is before `updated_at` (the clock stepped back), no time
    /// elapsed and the bucket is rebased on `now`: refill resumes from there, and since nothing is added for
    /// the step itself, no time is ever counted twice.
    pub fn refilled(&self, limit: &Limit, now: i64) -> Bucket {
        Bucket {
            level: self.level_at(limit, now),
            updated_at: now,
        }
    }

    /// Whole tokens available at `now` (`floor`).
    pub fn tokens_at(&self, limit: &Limit, now: i64) -> i64 {
        self.level_at(limit, now) / limit.period_us
    }

    /// The first instant, at or after `now`, at which `cost` tokens could be in the bucket if nobody took
    /// any: `now` if they are there already, `None` if `cost` exceeds the capacity (never).
    pub fn available_at(&self, limit: &Limit, now: i64, cost: i64) -> Option<i64> {
        if cost > limit.burst {
            return None;
        }
        let current = self.refilled(limit, now);
        let need = i128::from(cost) * i128::from(limit.period_us);
        let deficit = need - i128::from(current.level);
        if deficit <= 0 {
            return Some(now);
        }
        // ceil(deficit / rate) microseconds after the bucket's own instant (which is >= now)
        let wait = (deficit + i128::from(limit.rate) - 1) / i128::from(limit.rate);
        let at = i128::from(current.updated_at) + wait;
        Some(i64::try_from(at).unwrap_or(i64::MAX))
    }

    /// Asks for `cost` tokens at `now`. `cost` must be at least 1 (callers validate it).
    pub fn take(&self, limit: &Limit, now: i64, cost: i64) -> Take {
        let current = self.refilled(limit, now);
        let need = i128::from(cost) * i128::from(limit.period_us);
        if cost < 1 || i128::from(current.level) < need {
            return Take::Denied {
                available: current.level / limit.period_us,
            };
        }
        // need <= current.level, an i64, so the subtraction stays in range and non-negative.
        let level = (i128::from(current.level) - need) as i64;
        Take::Granted {
            bucket: Bucket {
                level,
                updated_at: current.updated_at,
            },
            remaining: level / limit.period_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: i64 = MICROS_PER_SECOND;

    fn per_sec(rate: i64, window: i64) -> Limit {
        Limit::per_second(rate, window).expect("valid test limit")
    }

    /// Runs calls of cost 1 at the given instants from a missing bucket; returns what each call returned.
    fn run(limit: &Limit, instants: &[i64]) -> Vec<i64> {
        let mut state: Option<Bucket> = None;
        instants
            .iter()
            .map(|&now| {
                let bucket = state.unwrap_or_else(|| Bucket::full(limit, now));
                match bucket.take(limit, now, 1) {
                    Take::Granted { bucket, remaining } => {
                        state = Some(bucket);
                        remaining
                    }
                    Take::Denied { .. } => -1,
                }
            })
            .collect()
    }

    #[test]
    fn reference_example_timeline() {
        let limit = per_sec(1, 10);
        let mut instants: Vec<i64> = (0..12).map(|i| i * 1000).collect();
        instants.push(11_000 + 4 * S);
        assert_eq!(
            run(&limit, &instants),
            vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -1, 3]
        );
    }

    #[test]
    fn polling_faster_than_refill_still_gets_the_rate() {
        // refill 2/s, window 5 s: drain 10, then one call every 100 ms for 6 s.
        let limit = per_sec(2, 5);
        let mut instants: Vec<i64> = vec![0; 10];
        instants.extend((1..=60).map(|i| i * 100_000));
        let results = run(&limit, &instants);
        assert!(results[..10].iter().all(|&r| r >= 0));
        let granted_while_polling = results[10..].iter().filter(|&&r| r >= 0).count();
        assert_eq!(granted_while_polling, 12);
    }

    #[test]
    fn backward_clock_grants_nothing_and_rebases() {
        let limit = per_sec(1, 10);
        let drained = Bucket {
            level: 0,
            updated_at: 100 * S,
        };
        // the clock steps back 50 s: no refill, and the bucket is rebased on the new time
        assert_eq!(drained.level_at(&limit, 50 * S), 0);
        let rebased = drained.refilled(&limit, 50 * S);
        assert_eq!(
            rebased,
            Bucket {
                level: 0,
                updated_at: 50 * S
            }
        );
        assert_eq!(
            drained.take(&limit, 50 * S, 1),
            Take::Denied { available: 0 }
        );
        // refill resumes at the rate from the step, not from the old, later instant (no freeze)
        assert_eq!(rebased.tokens_at(&limit, 53 * S), 3);
        assert_eq!(rebased.available_at(&limit, 50 * S, 1), Some(51 * S));
    }

    #[test]
    fn denied_call_leaves_state_unchanged() {
        let limit = per_sec(2, 5);
        let b = Bucket {
            level: S / 2,
            updated_at: 0,
        };
        assert_eq!(b.take(&limit, 100_000, 1), Take::Denied { available: 0 });
        // 0.5 + 0.2 * 2.5 = 1 token exactly at 250 ms
        assert!(matches!(
            b.take(&limit, 250_000, 1),
            Take::Granted { remaining: 0, .. }
        ));
    }

    #[test]
    fn extreme_time_gaps_do_not_overflow() {
        let limit = per_sec(i64::from(i32::MAX), 1);
        let b = Bucket {
            level: 0,
            updated_at: i64::MIN,
        };
        assert_eq!(b.level_at(&limit, i64::MAX), limit.full_level());
        let b = Bucket {
            level: 0,
            updated_at: i64::MAX,
        };
        assert_eq!(b.level_at(&limit, i64::MIN), 0);
        let corrupt = Bucket {
            level: i64::MAX,
            updated_at: 0,
        };
        assert_eq!(corrupt.level_at(&limit, 0), limit.full_level());
        // a negative level is a debt: kept as it is, refilled over time, never overflowing
        let negative = Bucket {
            level: i64::MIN,
            updated_at: 0,
        };
        assert_eq!(negative.level_at(&limit, 0), i64::MIN);
        assert_eq!(negative.level_at(&limit, i64::MAX), limit.full_level());
    }

    #[test]
    fn limit_validation() {
        assert_eq!(Limit::per_second(0, 1), Err(LimitError::RateNotPositive));
        assert_eq!(Limit::per_second(1, 0), Err(LimitError::PeriodNotPositive));
        assert_eq!(Limit::new(1, 1, 0), Err(LimitError::BurstNotPositive));
        assert_eq!(Limit::per_second(i64::MAX, 2), Err(LimitError::TooLarge));
        assert_eq!(Limit::new(1, i64::MAX, 2), Err(LimitError::TooLarge));
        // the largest capacity rate_limiting_request accepts is 2^31 tokens: 2^31 × 10^6 ticks fits
        let big = per_sec(1 << 16, 1 << 15);
        assert_eq!(big.burst(), 1 << 31);
        assert_eq!(big.full_level(), (1i64 << 31) * S);
    }

    #[test]
    fn available_at_is_the_first_instant_with_enough_tokens() {
        let limit = per_sec(2, 5); // one token every 500 ms
        let b = Bucket {
            level: S / 4,
            updated_at: 1_000,
        };
        // 0.25 token now: 0.75 more take 375 ms
        let at = b.available_at(&limit, 1_000, 1).unwrap();
        assert_eq!(at, 1_000 + 375_000);
        assert!(matches!(b.take(&limit, at - 1, 1), Take::Denied { .. }));
        assert!(matches!(b.take(&limit, at, 1), Take::Granted { .. }));
        assert_eq!(b.available_at(&limit, at + 5, 1), Some(at + 5));
        assert_eq!(b.available_at(&limit, 0, 11), None);
        // a clock behind the bucket's instant: no time elapsed, refill counts from the clock's instant
        assert_eq!(b.available_at(&limit, 0, 1), Some(375_000));
    }

    #[test]
    fn millionths_print_exactly() {
        assert_eq!(millionths_to_decimal(1_500_000), "1.500000");
        assert_eq!(millionths_to_decimal(7), "0.000007");
        assert_eq!(
            millionths_to_decimal(2_147_483_648_000_000),
            "2147483648.000000"
        );
        assert_eq!(millionths_to_decimal(-250_000), "-0.250000");
        assert_eq!(millionths_to_decimal(-3_000_001), "-3.000001");
        assert_eq!(millionths_to_decimal(i64::MIN), "-9223372036854.775808");
    }

    #[test]
    fn cost_above_capacity_is_denied() {
        let limit = per_sec(1, 3);
        let b = Bucket::full(&limit, 0);
        assert_eq!(b.take(&limit, 0, 4), Take::Denied { available: 3 });
        assert!(matches!(
            b.take(&limit, 0, 3),
            Take::Granted { remaining: 0, .. }
        ));
    }

    // ---- the slow exact model -------------------------------------------------------------------------

    fn gcd(mut a: i128, mut b: i128) -> i128 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a.abs()
    }

    /// A non-negative rational number of tokens, kept reduced.
    #[derive(Clone, Copy, Debug)]
    struct Ratio {
        num: i128,
        den: i128,
    }

    impl Ratio {
        fn new(num: i128, den: i128) -> Ratio {
            let g = gcd(num, den).max(1);
            Ratio {
                num: num / g,
                den: den / g,
            }
        }
        fn add(self, o: Ratio) -> Ratio {
            Ratio::new(self.num * o.den + o.num * self.den, self.den * o.den)
        }
        fn min_int(self, v: i128) -> Ratio {
            if self.num > v * self.den {
                Ratio::new(v, 1)
            } else {
                self
            }
        }
        fn at_least(self, v: i128) -> bool {
            self.num >= v * self.den
        }
        fn floor(self) -> i128 {
            self.num.div_euclid(self.den)
        }
    }

    /// Token bucket in rational tokens, written from the definition: refill `rate × elapsed / period`,
    /// capped at `burst`; a clock behind the last instant adds nothing and becomes the new last instant.
    struct Model {
        rate: i128,
        period: i128,
        burst: i128,
        tokens: Option<(Ratio, i64)>,
    }

    impl Model {
        fn call(&mut self, now: i64, cost: i128) -> i64 {
            let (tokens, last) = self.tokens.unwrap_or((Ratio::new(self.burst, 1), now));
            let elapsed = (i128::from(now) - i128::from(last)).max(0);
            let tokens = tokens
                .add(Ratio::new(self.rate * elapsed, self.period))
                .min_int(self.burst);
            let last = now;
            if tokens.at_least(cost) {
                let left = tokens.add(Ratio::new(-cost, 1));
                self.tokens = Some((left, last));
                left.floor() as i64
            } else {
                -1
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Any sequence of calls, with gaps that may be zero, tiny, huge or negative (clock steps back),
        /// returns exactly what the rational model returns.
        #[test]
        fn matches_exact_model(
            rate in 1i64..=5_000,
            period_us in prop_oneof![Just(MICROS_PER_SECOND), 1i64..=10_000_000],
            burst in 1i64..=10_000,
            steps in prop::collection::vec(
                (prop_oneof![
                    0i64..=10,
                    0i64..=2_000_000,
                    Just(3_600 * MICROS_PER_SECOND),
                    -5_000_000i64..=0,
                ], 1i64..=4),
                1..120),
        ) {
            let limit = Limit::new(rate, period_us, burst).unwrap();
            let mut model = Model {
                rate: rate.into(),
                period: period_us.into(),
                burst: burst.into(),
                tokens: None,
            };
            let mut state: Option<Bucket> = None;
            let mut now: i64 = 1_000_000_000;
            for (gap, cost) in steps {
                now += gap;
                let bucket = state.unwrap_or_else(|| Bucket::full(&limit, now));
                let got = match bucket.take(&limit, now, cost) {
                    Take::Granted { bucket, remaining } => {
                        state = Some(bucket);
                        remaining
                    }
                    Take::Denied { .. } => -1,
                };
                prop_assert_eq!(got, model.call(now, cost.into()));
            }
        }

        /// A client polling at a fixed interval receives exactly burst + floor(rate × elapsed / period),
        /// whatever the interval: no partial refill is lost to rounding. (With a capacity of 2 or more; a
        /// one-token bucket caps at 1 and so, correctly, wastes the refill that arrives while it is full.)
        #[test]
        fn frequent_callers_receive_exactly_the_rate(
            rate in 1i64..=100,
            window in 2i64..=10,
            interval_us in 1i64..=200_000,
            calls in 1usize..2_000,
        ) {
            let limit = per_sec(rate, window);
            let instants: Vec<i64> = (0..calls as i64).map(|i| i * interval_us).collect();
            let granted = run(&limit, &instants).iter().filter(|&&r| r >= 0).count() as i64;
            let elapsed = instants[calls - 1];
            let exact = (limit.burst() + rate * elapsed / MICROS_PER_SECOND).min(calls as i64);
            prop_assert_eq!(granted, exact);
        }

        /// `available_at` is exact: denied one microsecond before it, granted at it (measured on the state
        /// at `now`, which a clock behind the stored instant rebases, and which the store then keeps).
        #[test]
        fn available_at_agrees_with_take(level in 0i64..=10_000_000, rate in 1i64..=1000,
                                        window in 1i64..=10, cost in 1i64..=10, now in 0i64..=10_000_000) {
            let limit = per_sec(rate, window);
            let stored = Bucket { level: level.min(limit.full_level()), updated_at: 5_000_000 };
            let b = stored.refilled(&limit, now);
            prop_assert_eq!(stored.available_at(&limit, now, cost), b.available_at(&limit, now, cost));
            match b.available_at(&limit, now, cost) {
                None => prop_assert!(cost > limit.burst()),
                Some(at) => {
                    let granted = matches!(b.take(&limit, at, cost), Take::Granted { .. });
                    prop_assert!(granted);
                    if at > now {
                        let denied = matches!(b.take(&limit, at - 1, cost), Take::Denied { .. });
                        prop_assert!(denied);
                    }
                }
            }
        }

        /// Level is always within [min(stored, 0), full] and the state is rebased on `now`, for any stored
        /// state and now: refill never lowers a level, nor raises it above full.
        #[test]
        fn level_stays_in_range(level in any::<i64>(), at in any::<i64>(), now in any::<i64>(),
                                rate in 1i64..=i64::from(i32::MAX), window in 1i64..=1_000) {
            if let Ok(limit) = Limit::per_second(rate, window) {
                let b = Bucket { level, updated_at: at };
                let r = b.refilled(&limit, now);
                prop_assert!(r.level >= level.min(0) && r.level <= limit.full_level());
                prop_assert_eq!(r.updated_at, now);
            }
        }
    }
}
