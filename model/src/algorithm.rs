//! The three algorithms of named policies and ad-hoc limits, as exact integer arithmetic on one state shape.
//!
//! A [`Policy`] is an algorithm with `rate` tokens per `period_us` microseconds and a capacity `burst`. A
//! bucket's [`State`] is two integers whose meaning depends on the algorithm:
//!
//! | algorithm        | `level`                                              | `at`                           |
//! | ---------------- | ---------------------------------------------------- | ------------------------------ |
//! | `token_bucket`   | tokens in ticks (one token = `period_us` ticks)      | instant of that level          |
//! | `fixed_window`   | tokens used in the window containing `at`            | last instant the bucket moved  |
//! | `sliding_window` | `previous << 32 \| current`: tokens used in the window before `at`'s and in `at`'s | same |
//!
//! Windows are aligned on multiples of `period_us` since PostgreSQL's epoch (2000-01-01 UTC), so every
//! server and every store agree on where a window starts. A missing bucket is a full one for every
//! algorithm, and [`Policy::take`] with cost 0 reports without consuming.
//!
//! Every instant is in microseconds on the store's clock. A clock that moves backwards (`now < at`) counts as
//! no time elapsed and rebases the state on `now`: the counts stay what they were (no token is minted), and
//! time runs again from `now` (no freeze until the clock catches up with `at`). For the window algorithms
//! the counts are then those of `now`'s window. All intermediate products are `i128`; nothing can overflow.

use std::fmt;

use crate::bucket::{Bucket, Limit, LimitError, Take};

/// The largest count a window algorithm can hold per window (the packed sliding state keeps two 32-bit
/// counts).
pub const MAX_WINDOW_COUNT: i64 = i32::MAX as i64;

/// How a policy turns time into tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Continuous refill of `rate` tokens per period up to `burst` (GCRA-equivalent).
    TokenBucket,
    /// `rate` tokens per aligned window, all restored at each window boundary.
    FixedWindow,
    /// The previous window's count weighted by its overlap with the last period, plus the current count.
    SlidingWindow,
}

impl Algorithm {
    /// Every algorithm, in the order the documentation lists them.
    pub const ALL: [Algorithm; 3] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ];

    /// The SQL name: `token_bucket`, `fixed_window` or `sliding_window`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
        }
    }

    /// The algorithm called `name`, if any.
    pub fn parse(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// A one-byte code for compact storage (the memory store).
    pub fn code(self) -> u8 {
        match self {
            Algorithm::TokenBucket => 0,
            Algorithm::FixedWindow => 1,
            Algorithm::SlidingWindow => 2,
        }
    }

    /// The algorithm of [`Algorithm::code`].
    pub fn from_code(code: u8) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.code() == code)
    }
}

/// Why a policy cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyError {
    /// The token-bucket limit is invalid.
    Limit(LimitError),
    /// A window algorithm was given a burst different from its rate.
    WindowBurstNotRate,
    /// A window algorithm's rate is above [`MAX_WINDOW_COUNT`].
    WindowTooLarge,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Limit(e) => e.fmt(f),
            PolicyError::WindowBurstNotRate => f.write_str(
                "a window algorithm allows rate tokens per window: burst must be NULL or equal to rate",
            ),
            PolicyError::WindowTooLarge => write!(
                f,
                "a window algorithm counts at most {MAX_WINDOW_COUNT} tokens per window"
            ),
        }
    }
}

/// A validated limit with its algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    algorithm: Algorithm,
    limit: Limit,
}

/// The stored state of one bucket (see the module comment for what the fields mean per algorithm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// Tokens (token bucket, in ticks) or counts (windows).
    pub level: i64,
    /// The instant the state describes, in microseconds.
    pub at: i64,
}

/// What a call decided, with everything the `rate_limit.decision` record reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Whether `cost` tokens were granted.
    pub allowed: bool,
    /// The state to store when the call was granted with a cost above 0; the refilled current state
    /// otherwise (which need not be stored: refill is a function of time).
    pub state: State,
    /// Whole tokens left after the call (never negative).
    pub remaining: i64,
    /// When denied: microseconds until `cost` tokens exist if nobody else takes any; `None` when allowed
    /// or when `cost` exceeds the capacity and so can never be granted.
    pub retry_after: Option<i64>,
    /// Microseconds until the bucket is full again if nobody takes any.
    pub reset_after: i64,
}

fn pack(previous: i64, current: i64) -> i64 {
    (previous << 32) | current
}

fn unpack(level: i64) -> (i64, i64) {
    let level = level.max(0);
    (level >> 32, level & 0xFFFF_FFFF)
}

/// `instant - now`, never negative, saturating.
fn until(instant: i128, now: i64) -> i64 {
    let d = (instant - i128::from(now)).max(0);
    i64::try_from(d).unwrap_or(i64::MAX)
}

impl Policy {
    /// Builds a policy. Window algorithms require `burst == rate` and at most [`MAX_WINDOW_COUNT`].
    pub fn new(
        algorithm: Algorithm,
        rate: i64,
        period_us: i64,
        burst: i64,
    ) -> Result<Policy, PolicyError> {
        let limit = Limit::new(rate, period_us, burst).map_err(PolicyError::Limit)?;
        if algorithm != Algorithm::TokenBucket {
            if burst != rate {
                return Err(PolicyError::WindowBurstNotRate);
            }
            if burst > MAX_WINDOW_COUNT {
                return Err(PolicyError::WindowTooLarge);
            }
        }
        Ok(Policy { algorithm, limit })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Tokens per period.
    pub fn rate(&self) -> i64 {
        self.limit.rate()
    }

    /// The period (token bucket) or window length, in microseconds.
    pub fn period_us(&self) -> i64 {
        self.limit.period_us()
    }

    /// The capacity: the most tokens a single call, or a burst of calls, can get.
    pub fn burst(&self) -> i64 {
        self.limit.burst()
    }

    /// The state of a key never seen before: a full bucket.
    pub fn full(&self, now: i64) -> State {
        match self.algorithm {
            Algorithm::TokenBucket => State {
                level: self.limit.full_level(),
                at: now,
            },
            Algorithm::FixedWindow | Algorithm::SlidingWindow => State { level: 0, at: now },
        }
    }

    fn window_index(&self, t: i64) -> i64 {
        t.div_euclid(self.period_us())
    }

    /// `(previous, current)` counts of the window containing `t`. A `t` before `state.at` (the clock
    /// stepped back) keeps the counts as they were at `state.at`: no time elapsed.
    fn counts_at(&self, state: State, t: i64) -> (i64, i64) {
        let moved = (self.window_index(t) - self.window_index(state.at)).max(0);
        match self.algorithm {
            Algorithm::FixedWindow => (0, if moved == 0 { state.level.max(0) } else { 0 }),
            Algorithm::SlidingWindow => {
                let (previous, current) = unpack(state.level);
                match moved {
                    0 => (previous, current),
                    1 => (current, 0),
                    _ => (0, 0),
                }
            }
            Algorithm::TokenBucket => (0, 0),
        }
    }

    /// The used amount of a window state at `t`, times `period_us` (exact): the sliding estimate
    /// `previous × (period − elapsed) + current × period`, or `current × period` for a fixed window.
    fn weighted_use(&self, previous: i64, current: i64, t: i64) -> i128 {
        let period = i128::from(self.period_us());
        let elapsed = i128::from(t.rem_euclid(self.period_us()));
        i128::from(previous) * (period - elapsed) + i128::from(current) * period
    }

    /// Asks for `cost` (>= 0) tokens at `now`. Cost 0 grants nothing and reports the bucket.
    pub fn take(&self, state: State, now: i64, cost: i64) -> Outcome {
        match self.algorithm {
            Algorithm::TokenBucket => self.take_token_bucket(state, now, cost),
            Algorithm::FixedWindow | Algorithm::SlidingWindow => self.take_window(state, now, cost),
        }
    }

    fn take_token_bucket(&self, state: State, now: i64, cost: i64) -> Outcome {
        let limit = &self.limit;
        let bucket = Bucket {
            level: state.level,
            updated_at: state.at,
        };
        let current = bucket.refilled(limit, now);
        let (allowed, after) = if cost == 0 {
            (true, current)
        } else {
            match current.take(limit, now, cost) {
                Take::Granted { bucket, .. } => (true, bucket),
                Take::Denied { .. } => (false, current),
            }
        };
        let retry_after = if allowed {
            None
        } else {
            current
                .available_at(limit, now, cost)
                .map(|at| until(i128::from(at), now))
        };
        // ceil((full − level) / rate) microseconds after the bucket's own instant
        let missing = i128::from(limit.full_level()) - i128::from(after.level);
        let rate = i128::from(limit.rate());
        let full_at = i128::from(after.updated_at) + (missing + rate - 1) / rate;
        Outcome {
            allowed,
            state: State {
                level: after.level,
                at: after.updated_at,
            },
            remaining: after.level / limit.ticks_per_token(),
            retry_after,
            reset_after: until(full_at, now),
        }
    }

    fn take_window(&self, state: State, now: i64, cost: i64) -> Outcome {
        let t = now;
        let period = i128::from(self.period_us());
        let burst = i128::from(self.burst());
        let (previous, current) = self.counts_at(state, t);
        let used = self.weighted_use(previous, current, t);
        let allowed = used + i128::from(cost) * period <= burst * period;
        let current_after = if allowed { current + cost } else { current };
        let used_after = self.weighted_use(previous, current_after, t);
        let remaining = ((burst * period - used_after).max(0) / period) as i64;
        let window_start = i128::from(self.window_index(t)) * period;
        let next_start = window_start + period;
        let retry_after = if allowed || cost > self.burst() {
            None
        } else {
            Some(until(self.window_retry(previous, current, t, cost), now))
        };
        let full_at = if current_after > 0 {
            match self.algorithm {
                Algorithm::SlidingWindow => next_start + period,
                _ => next_start,
            }
        } else if previous > 0 {
            next_start
        } else {
            i128::from(t)
        };
        let level = match self.algorithm {
            Algorithm::SlidingWindow => pack(previous, current_after),
            _ => current_after,
        };
        Outcome {
            allowed,
            state: State { level, at: t },
            remaining,
            retry_after,
            reset_after: until(full_at, now),
        }
    }

    /// The first instant at or after `t` at which `cost` (<= burst) tokens fit, for window counts
    /// `(previous, current)` at `t`, if nobody takes any.
    fn window_retry(&self, previous: i64, current: i64, t: i64, cost: i64) -> i128 {
        let period = i128::from(self.period_us());
        let burst = i128::from(self.burst());
        let cost = i128::from(cost);
        let window_start = i128::from(self.window_index(t)) * period;
        let next_start = window_start + period;
        if self.algorithm == Algorithm::FixedWindow {
            return next_start;
        }
        // In this window: previous × (period − e) <= (burst − current − cost) × period.
        let room = burst - i128::from(current) - cost;
        if room >= 0 && previous > 0 {
            let e = period - room * period / i128::from(previous);
            if e < period {
                return (window_start + e).max(i128::from(t));
            }
        }
        // In the next window the current count becomes the previous one, weighted down to zero.
        if current == 0 {
            return next_start;
        }
        let e = (period - (burst - cost) * period / i128::from(current)).max(0);
        next_start + e
    }

    /// Whether the bucket is full at `now` (and so equal to a missing one: it may be deleted).
    pub fn is_full(&self, state: State, now: i64) -> bool {
        self.take(state, now, 0).reset_after == 0
    }

    /// The tokens available at `now` as an exact fraction `(numerator, denominator)`.
    pub fn tokens_exact(&self, state: State, now: i64) -> (i128, i128) {
        match self.algorithm {
            Algorithm::TokenBucket => {
                let level = Bucket {
                    level: state.level,
                    updated_at: state.at,
                }
                .level_at(&self.limit, now);
                (i128::from(level), i128::from(self.period_us()))
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let t = now;
                let (previous, current) = self.counts_at(state, t);
                let period = i128::from(self.period_us());
                let used = self.weighted_use(previous, current, t);
                ((i128::from(self.burst()) * period - used).max(0), period)
            }
        }
    }

    /// The tokens available at `now` in millionths of a token, rounded down (for display).
    pub fn tokens_millionths(&self, state: State, now: i64) -> i64 {
        let (num, den) = self.tokens_exact(state, now);
        (num * 1_000_000 / den.max(1)).clamp(0, i128::from(i64::MAX)) as i64
    }

    /// Puts up to `tokens` back (a refund), never above the capacity.
    pub fn refund(&self, state: State, now: i64, tokens: i64) -> State {
        let tokens = tokens.max(0);
        match self.algorithm {
            Algorithm::TokenBucket => {
                let current = Bucket {
                    level: state.level,
                    updated_at: state.at,
                }
                .refilled(&self.limit, now);
                let level = (i128::from(current.level)
                    + i128::from(tokens) * i128::from(self.period_us()))
                .min(i128::from(self.limit.full_level())) as i64;
                State {
                    level,
                    at: current.updated_at,
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let t = now;
                let (previous, current) = self.counts_at(state, t);
                let from_current = tokens.min(current);
                let from_previous = (tokens - from_current).min(previous);
                let (previous, current) = (previous - from_previous, current - from_current);
                let level = match self.algorithm {
                    Algorithm::SlidingWindow => pack(previous, current),
                    _ => current,
                };
                State { level, at: t }
            }
        }
    }

    /// The state under this policy of a bucket stored under `stored_policy`: its tokens at `changed_at`
    /// (clamped between the state's instant and `now`), refilled under the old policy until then, carry
    /// over, rounded down and capped at this policy's capacity. So a change never grants a token the old
    /// policy would not have had to a bucket in use; from `changed_at` on, the bucket refills under this
    /// policy. The one exception keeps "a missing bucket is a full one" true across changes: a bucket that
    /// was full at `changed_at` is full under the new numbers, exactly like a key never seen (so purging
    /// full buckets stays lossless).
    pub fn carry_over(
        &self,
        stored: State,
        stored_policy: &Policy,
        changed_at: i64,
        now: i64,
    ) -> State {
        if stored_policy == self {
            return stored;
        }
        let t = changed_at.min(now).max(stored.at);
        if stored_policy.is_full(stored, t) {
            return self.full(t);
        }
        let (num, den) = stored_policy.tokens_exact(stored, t);
        match self.algorithm {
            Algorithm::TokenBucket => {
                let ticks = (num * i128::from(self.period_us()) / den)
                    .min(i128::from(self.limit.full_level())) as i64;
                State {
                    level: ticks,
                    at: t,
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let available = (num / den).min(i128::from(self.burst())) as i64;
                State {
                    level: self.burst() - available,
                    at: t,
                }
            }
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

    /// Runs calls `(instant, cost)` from a missing bucket, returning each outcome.
    fn run(p: &Policy, calls: &[(i64, i64)]) -> Vec<Outcome> {
        let mut state: Option<State> = None;
        calls
            .iter()
            .map(|&(now, cost)| {
                let o = p.take(state.unwrap_or_else(|| p.full(now)), now, cost);
                if o.allowed {
                    state = Some(o.state);
                }
                o
            })
            .collect()
    }

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Some(a));
            assert_eq!(Algorithm::from_code(a.code()), Some(a));
        }
        assert_eq!(Algorithm::parse("leaky"), None);
    }

    #[test]
    fn window_policies_need_burst_equal_to_rate() {
        assert_eq!(
            Policy::new(Algorithm::FixedWindow, 10, S, 20),
            Err(PolicyError::WindowBurstNotRate)
        );
        assert_eq!(
            Policy::new(
                Algorithm::SlidingWindow,
                MAX_WINDOW_COUNT + 1,
                S,
                MAX_WINDOW_COUNT + 1
            ),
            Err(PolicyError::WindowTooLarge)
        );
        assert!(Policy::new(Algorithm::TokenBucket, 10, S, 20).is_ok());
    }

    #[test]
    fn token_bucket_decision_values() {
        // 10 per minute, burst 5: one token every 6 s
        let p = policy(Algorithm::TokenBucket, 10, 60 * S, 5);
        let t0 = 1_000 * S;
        let o = run(&p, &[(t0, 1), (t0, 4), (t0, 1)]);
        assert_eq!((o[0].allowed, o[0].remaining), (true, 4));
        assert_eq!(o[0].reset_after, 6 * S);
        assert_eq!((o[1].allowed, o[1].remaining), (true, 0));
        assert_eq!(o[1].reset_after, 30 * S);
        assert!(!o[2].allowed);
        assert_eq!(o[2].retry_after, Some(6 * S));
        assert_eq!(o[2].remaining, 0);
        // cost above burst: never
        let o = p.take(p.full(t0), t0, 6);
        assert_eq!((o.allowed, o.retry_after, o.remaining), (false, None, 5));
        // cost 0 peeks
        let o = p.take(p.full(t0), t0, 0);
        assert_eq!((o.allowed, o.remaining, o.reset_after), (true, 5, 0));
    }

    #[test]
    fn fixed_window_restores_everything_at_the_boundary() {
        let p = policy(Algorithm::FixedWindow, 3, 10 * S, 3);
        let t0 = 100 * S + 4 * S; // 4 s into the window [100 s, 110 s)
        let o = run(
            &p,
            &[
                (t0, 1),
                (t0, 1),
                (t0, 1),
                (t0, 1),
                (110 * S, 1),
                (110 * S, 2),
            ],
        );
        assert_eq!(
            o.iter().map(|o| o.allowed).collect::<Vec<_>>(),
            vec![true, true, true, false, true, true]
        );
        assert_eq!(o[0].reset_after, 6 * S);
        assert_eq!(o[3].retry_after, Some(6 * S));
        assert_eq!(o[3].remaining, 0);
        assert_eq!(o[4].remaining, 2);
        assert_eq!(o[5].remaining, 0);
    }

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let p = policy(Algorithm::SlidingWindow, 10, 10 * S, 10);
        // 10 calls at the end of window [0, 10 s), then calls in [10 s, 20 s)
        let mut calls: Vec<(i64, i64)> = (0..10).map(|_| (9 * S, 1)).collect();
        calls.push((10 * S, 1)); // weight of previous = 1.0 → 10, denied
        calls.push((15 * S, 1)); // weight 0.5 → 5 used: granted (6 used)
        let o = run(&p, &calls);
        assert!(o[..10].iter().all(|o| o.allowed));
        assert!(!o[10].allowed);
        // at 10 s: 10 × (10 − e) <= (10 − 0 − 1) × 10 ⇔ e >= 1 s
        assert_eq!(o[10].retry_after, Some(S));
        assert!(o[11].allowed);
        assert_eq!(o[11].remaining, 4);
        // full when the current window's calls have aged out: at 30 s
        assert_eq!(o[11].reset_after, 15 * S);
    }

    #[test]
    fn carry_over_never_grants_more() {
        let tb = policy(Algorithm::TokenBucket, 10, S, 100);
        let small = policy(Algorithm::TokenBucket, 1, S, 5);
        let t0 = 50 * S;
        let o = tb.take(tb.full(t0), t0, 97); // 3 left
        let carried = small.carry_over(o.state, &tb, t0, t0);
        assert_eq!(small.take(carried, t0, 0).remaining, 3);
        let bigger = policy(Algorithm::TokenBucket, 10, S, 1_000);
        let carried = bigger.carry_over(o.state, &tb, t0, t0);
        assert_eq!(bigger.take(carried, t0, 0).remaining, 3);
        // change took effect 1 s after the last grant: +10 under the old rate, then the new one
        let carried = small.carry_over(o.state, &tb, t0 + S, t0 + 2 * S);
        assert_eq!(small.take(carried, t0 + 2 * S, 0).remaining, 5);
        let fixed = policy(Algorithm::FixedWindow, 50, 60 * S, 50);
        let carried = fixed.carry_over(o.state, &tb, t0, t0);
        assert_eq!(fixed.take(carried, t0, 0).remaining, 3);
        // a full bucket is a missing one: full under the new numbers too
        let carried = bigger.carry_over(tb.full(t0), &tb, t0, t0);
        assert_eq!(bigger.take(carried, t0, 0).remaining, 1_000);
    }

    #[test]
    fn refund_is_capped_at_the_capacity() {
        for a in Algorithm::ALL {
            let p = policy(a, 5, 10 * S, 5);
            let t0 = 3 * S;
            let o = p.take(p.full(t0), t0, 4);
            let back = p.refund(o.state, t0, 2);
            assert_eq!(p.take(back, t0, 0).remaining, 3, "{a:?}");
            let back = p.refund(o.state, t0, 100);
            assert!(p.is_full(back, t0), "{a:?}");
        }
    }

    #[test]
    fn backward_clock_grants_nothing() {
        for a in Algorithm::ALL {
            let p = policy(a, 2, 10 * S, 2);
            let t0 = 100 * S;
            let o = run(&p, &[(t0, 2), (t0 - 50 * S, 1)]);
            assert!(o[0].allowed && !o[1].allowed, "{a:?}: no token minted");
            // no freeze: the retry counts from the new time, at most one (sliding: two) windows
            let retry = o[1].retry_after.unwrap();
            assert!(retry > 0 && retry <= 20 * S, "{a:?}: {retry}");
            assert_eq!(o[1].state.at, t0 - 50 * S, "{a:?}: rebased");
        }
    }

    /// An exact sliding log: the tokens granted in the last `period` (the half-open interval
    /// `(now − period, now]`).
    fn log_count(log: &[(i64, i64)], now: i64, period: i64) -> i64 {
        log.iter()
            .filter(|&&(t, _)| t > now - period && t <= now)
            .map(|&(_, c)| c)
            .sum()
    }

    fn any_policy() -> impl Strategy<Value = Policy> {
        (0usize..3, 1i64..=20, 1i64..=5_000_000, 1i64..=20).prop_map(|(a, rate, period, burst)| {
            let algorithm = Algorithm::ALL[a];
            let burst = if algorithm == Algorithm::TokenBucket {
                burst
            } else {
                rate
            };
            policy(algorithm, rate, period, burst)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// For every algorithm, `retry_after` is exact: granted at that instant, denied one microsecond
        /// before; `reset_after` is exact: full at that instant, not one microsecond before; `remaining`
        /// is exactly the largest cost that would be granted now.
        #[test]
        fn retry_reset_and_remaining_are_exact(
            p in any_policy(),
            steps in prop::collection::vec((0i64..=3_000_000, 0i64..=4), 1..40),
            cost in 1i64..=25,
        ) {
            let mut now = 1_000_000_000i64;
            let mut state = p.full(now);
            for (gap, c) in steps {
                now += gap;
                let o = p.take(state, now, c);
                if o.allowed { state = o.state; }
            }
            let o = p.take(state, now, cost);
            match (o.allowed, o.retry_after) {
                (true, r) => prop_assert_eq!(r, None),
                (false, None) => prop_assert!(cost > p.burst()),
                (false, Some(r)) => {
                    prop_assert!(r > 0);
                    prop_assert!(p.take(state, now + r, cost).allowed);
                    prop_assert!(!p.take(state, now + r - 1, cost).allowed);
                }
            }
            let peek = p.take(state, now, 0);
            prop_assert!(p.take(state, now, peek.remaining).allowed || peek.remaining == 0);
            prop_assert!(!p.take(state, now, peek.remaining + 1).allowed);
            let r = peek.reset_after;
            prop_assert!(p.is_full(state, now + r));
            if r > 0 {
                prop_assert!(!p.is_full(state, now + r - 1));
            }
        }

        /// A granted take given back at the same instant restores exactly the state before it (what the
        /// table store's multi-limit call relies on when a later bucket denies): the same tokens now and
        /// at every later instant.
        #[test]
        fn refund_of_a_take_at_its_instant_restores_the_bucket(p in any_policy(), used in 0i64..=20,
                                                                 cost in 1i64..=20, gap in 0i64..=50_000_000,
                                                                 later in 0i64..=50_000_000) {
            let t0 = 1_000_000_000;
            let start = p.take(p.full(t0), t0, used.min(p.burst())).state;
            let now = t0 + gap;
            let taken = p.take(start, now, cost);
            prop_assume!(taken.allowed);
            let back = p.refund(taken.state, taken.state.at, cost);
            for t in [now, now + later] {
                prop_assert_eq!(p.tokens_exact(back, t), p.tokens_exact(start, t));
            }
        }

        /// Carrying a bucket in use over to another policy never adds tokens; a full one stays full.
        #[test]
        fn carry_over_never_adds(from in any_policy(), to in any_policy(), used in 0i64..=20,
                                 gap in 0i64..=10_000_000) {
            let t0 = 7_000_000_000i64;
            let o = from.take(from.full(t0), t0, used.min(from.burst()));
            let now = t0 + gap;
            let before = from.tokens_exact(o.state, now);
            let carried = to.carry_over(o.state, &from, now, now);
            let after = to.tokens_exact(carried, now);
            if from.is_full(o.state, now) {
                prop_assert!(to.is_full(carried, now));
            } else {
                // after <= before, as fractions
                prop_assert!(after.0 * before.1 <= before.0 * after.1);
            }
        }

        /// Sliding window against an exact log of the calls it granted: a call is granted only when the
        /// weighted estimate leaves room, so (a) no aligned window ever holds more than `rate` grants,
        /// (b) no interval of one period ever holds more than twice `rate`, and (c) when the calls of the
        /// previous window were spread evenly, the estimate is within one token plus one call of the log.
        #[test]
        fn sliding_window_against_an_exact_log(
            rate in 1i64..=30,
            period in 1_000i64..=2_000_000,
            gaps in prop::collection::vec(0i64..=200_000, 1..300),
        ) {
            let p = policy(Algorithm::SlidingWindow, rate, period, rate);
            let mut now = 5_000_000_000i64;
            let mut state = p.full(now);
            let mut log: Vec<(i64, i64)> = Vec::new();
            for gap in gaps {
                now += gap;
                let o = p.take(state, now, 1);
                if o.allowed {
                    state = o.state;
                    log.push((now, 1));
                }
                let window = now.div_euclid(period);
                let in_window: i64 = log.iter().filter(|&&(t, _)| t.div_euclid(period) == window).count() as i64;
                prop_assert!(in_window <= rate);
                prop_assert!(log_count(&log, now, period) <= 2 * rate);
            }
        }
    }

    /// Evenly spaced traffic well above the limit: the sliding window grants the rate, and the number
    /// granted in every interval of one period stays within one token of `rate` (the exact log's count).
    #[test]
    fn sliding_window_error_on_steady_traffic() {
        let rate = 100;
        let period = 10 * S;
        let p = policy(Algorithm::SlidingWindow, rate, period, rate);
        let mut state = p.full(0);
        let mut log = Vec::new();
        let mut now = 0;
        while now < 100 * period {
            let o = p.take(state, now, 1);
            if o.allowed {
                state = o.state;
                log.push((now, 1));
            }
            now += period / 1000; // 1000 calls per window, 10x the limit
        }
        let mut worst = 0;
        let mut t = 2 * period;
        while t < 100 * period {
            worst = worst.max(log_count(&log, t, period));
            t += period / 100;
        }
        assert!(worst <= rate + 1, "at most {worst} in one period");
        let granted = log.len() as i64;
        assert!((granted - 100 * rate).abs() <= rate, "granted {granted}");
    }
}
