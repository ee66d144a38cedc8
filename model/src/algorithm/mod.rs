//! The algorithms of named policies and ad-hoc limits (token bucket, fixed and sliding window, calendar
//! window) and the kinds of bucket beside them (concurrency leases, blocks), as exact integer arithmetic on
//! one state shape.
//!
//! A [`Policy`] is an algorithm with `rate` tokens per `period_us` microseconds and a capacity `burst`. A
//! bucket's [`State`] is two integers whose meaning depends on the algorithm:
//!
//! | algorithm        | `level`                                              | `at`                           |
//! | ---------------- | ---------------------------------------------------- | ------------------------------ |
//! | `token_bucket`   | tokens in ticks (one token = `period_us` ticks)      | instant of that level          |
//! | `fixed_window`   | tokens used in the window containing `at`            | last instant the bucket moved  |
//! | `sliding_window` | `previous << 32 \| current`: tokens used in the window before `at`'s and in `at`'s | same |
//! | `calendar_window`| `end_seconds << 31 \| count`: tokens used in the open window, and when it ends | same |
//!
//! Fixed and sliding windows are aligned on multiples of `period_us` since PostgreSQL's epoch (2000-01-01
//! UTC), so every server and every store agree on where a window starts. Calendar windows start at dates
//! on a time zone's clocks (see [`calendar`]); their `period_us` is nominal (the HTTP window `w`). A missing bucket is a full one for every
//! algorithm, and [`Policy::take`] with cost 0 reports without consuming.
//!
//! Every instant is in microseconds on the store's clock. A clock that moves backwards (`now < at`) counts as
//! no time elapsed and rebases the state on `now`: the counts stay what they were (no token is minted), and
//! time runs again from `now` (no freeze until the clock catches up with `at`). For the window algorithms
//! the counts are then those of `now`'s window. All intermediate products are `i128`; nothing can overflow.

use std::fmt;

pub mod adaptive;
pub mod block;
pub mod booking;
pub mod calendar;
mod charge;
pub mod lease;
pub mod reservation;
pub mod token_bucket;
mod window;

pub use adaptive::{limit_namespace, Adaptive, Report};
pub use block::{block_namespace, shadow_block_namespace, MAX_BLOCK_US};
pub use booking::{booking_namespace, Booking};
pub use calendar::{Calendar, Step, Zone};
pub use charge::DebtError;
pub use lease::{lease_id, leases_outcome, slot_namespace, slot_of, MAX_LEASES};
pub use reservation::{reservation_namespace, MAX_HOLD_US};

use token_bucket::{Bucket, Limit, LimitError, Take};

/// The largest count a window algorithm can hold per window (the packed sliding state keeps two 32-bit
/// counts).
pub const MAX_WINDOW_COUNT: i64 = i32::MAX as i64;

/// Another name of the token bucket, for those who know it as the generic cell rate algorithm: a policy
/// created with it is a token bucket, and reads back as `token_bucket`.
pub const GCRA: &str = "gcra";

/// How a policy turns time into tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Continuous refill of `rate` tokens per period up to `burst` (GCRA-equivalent).
    TokenBucket,
    /// `rate` tokens per aligned window, all restored at each window boundary.
    FixedWindow,
    /// The previous window's count weighted by its overlap with the last period, plus the current count.
    SlidingWindow,
    /// `rate` tokens per window of a calendar (days, weeks, months, years in a time zone).
    CalendarWindow,
    /// At most `rate` leases held at once, each expiring `period_us` after it was acquired (see [`lease`]):
    /// a bucket of this algorithm is one lease slot.
    Concurrency,
    /// A key's block, or the denials its policy's penalty box counted (see [`block`]): never a policy's own
    /// algorithm, only that of the block bucket beside a key's bucket.
    Block,
    /// One reservation of a key's tokens, until it is settled or expires (see [`reservation`]): never a
    /// policy's own algorithm, only that of a reservation's bucket beside a key's bucket.
    Reservation,
    /// The adaptive limit of a key of an adaptive concurrency policy (see [`adaptive`]): never a policy's
    /// own algorithm, only that of the limit bucket beside a key's lease slots. Its numbers: `rate` and
    /// `burst` the most leases, `period_us` the latency target.
    AdaptiveLimit,
}

impl Algorithm {
    /// Every algorithm, in the order the documentation lists them.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::CalendarWindow,
        Algorithm::Concurrency,
        Algorithm::Block,
        Algorithm::Reservation,
        Algorithm::AdaptiveLimit,
    ];

    /// Whether a policy may be made with this algorithm (every one but [`Algorithm::Block`],
    /// [`Algorithm::Reservation`] and [`Algorithm::AdaptiveLimit`], which only the buckets beside a key's
    /// have).
    pub fn makes_policies(self) -> bool {
        !matches!(
            self,
            Algorithm::Block | Algorithm::Reservation | Algorithm::AdaptiveLimit
        )
    }

    /// The SQL name: `token_bucket`, `fixed_window`, `sliding_window`, `calendar_window`, `concurrency`,
    /// `block`, `reservation` or `adaptive_limit`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::CalendarWindow => "calendar_window",
            Algorithm::Concurrency => "concurrency",
            Algorithm::Block => "block",
            Algorithm::Reservation => "reservation",
            Algorithm::AdaptiveLimit => "adaptive_limit",
        }
    }

    /// The algorithm called `name`, if any. `gcra` (the generic cell rate algorithm, which decides
    /// exactly as a token bucket does) is another name of [`Algorithm::TokenBucket`].
    pub fn parse(name: &str) -> Option<Algorithm> {
        if name == GCRA {
            return Some(Algorithm::TokenBucket);
        }
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// A one-byte code for compact storage (the memory store).
    pub fn code(self) -> u8 {
        match self {
            Algorithm::TokenBucket => 0,
            Algorithm::FixedWindow => 1,
            Algorithm::SlidingWindow => 2,
            Algorithm::CalendarWindow => 3,
            Algorithm::Concurrency => 4,
            Algorithm::Block => 5,
            Algorithm::Reservation => 6,
            Algorithm::AdaptiveLimit => 7,
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
    /// A concurrency policy allows more than [`MAX_LEASES`] leases per key.
    TooManyLeases,
    /// A concurrency policy was given a burst different from its rate (the leases held at once).
    LeasesBurstNotRate,
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
            PolicyError::TooManyLeases => {
                write!(f, "a concurrency policy allows at most {MAX_LEASES} leases per key")
            }
            PolicyError::LeasesBurstNotRate => f.write_str(
                "a concurrency policy holds at most rate leases at once: burst must be NULL or equal to rate",
            ),
        }
    }
}

/// A validated limit with its algorithm, and the calendar of a calendar window.
///
/// Two policies are equal when their numbers are (algorithm, rate, period, burst): those are what a bucket
/// stores with its state and carries over from when they change. A calendar is not stored with a bucket,
/// and need not be: its state records its window's end (see [`calendar`]).
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    algorithm: Algorithm,
    limit: Limit,
    calendar: Option<Calendar>,
    /// For a calendar window known only by its numbers: the end of the window open at the call.
    open_until: Option<i64>,
}

impl PartialEq for Policy {
    fn eq(&self, other: &Policy) -> bool {
        self.algorithm == other.algorithm && self.limit == other.limit
    }
}

impl Eq for Policy {}

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

/// A token bucket's state as the token-bucket arithmetic holds it.
fn bucket_of(state: State) -> Bucket {
    Bucket {
        level: state.level,
        updated_at: state.at,
    }
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
        if algorithm == Algorithm::Concurrency && burst != rate {
            return Err(PolicyError::LeasesBurstNotRate);
        }
        if algorithm != Algorithm::TokenBucket {
            if burst != rate {
                return Err(PolicyError::WindowBurstNotRate);
            }
            if burst > MAX_WINDOW_COUNT {
                return Err(PolicyError::WindowTooLarge);
            }
        }
        if matches!(algorithm, Algorithm::Concurrency | Algorithm::AdaptiveLimit)
            && rate > MAX_LEASES
        {
            return Err(PolicyError::TooManyLeases);
        }
        Ok(Policy {
            algorithm,
            limit,
            calendar: None,
            open_until: None,
        })
    }

    /// A calendar-window policy of `rate` tokens per window of `calendar`: its period is the calendar's
    /// nominal step.
    pub fn calendar(rate: i64, calendar: Calendar) -> Result<Policy, PolicyError> {
        let mut policy = Policy::new(
            Algorithm::CalendarWindow,
            rate,
            calendar.step().nominal_us(),
            rate,
        )?;
        policy.calendar = Some(calendar);
        Ok(policy)
    }

    /// The calendar of a calendar-window policy built with [`Policy::calendar`].
    pub fn calendar_of(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// For a calendar window: the end of its window containing `t`; `None` for other algorithms.
    pub fn window_end(&self, t: i64) -> Option<i64> {
        (self.algorithm == Algorithm::CalendarWindow).then(|| self.calendar_window_end(t))
    }

    /// This policy, told that the calendar window open at the call ends at `end` (what
    /// [`Policy::window_end`] gave the caller): how a calendar window evaluated from its numbers alone (by
    /// the table store's SQL helper) opens its window where the calendar says.
    pub fn open_until(mut self, end: i64) -> Policy {
        self.open_until = Some(end);
        self
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
            Algorithm::FixedWindow
            | Algorithm::SlidingWindow
            | Algorithm::CalendarWindow
            | Algorithm::Concurrency
            | Algorithm::Block
            | Algorithm::Reservation => State { level: 0, at: now },
            Algorithm::AdaptiveLimit => State {
                level: self.rate().saturating_mul(adaptive::UNITS),
                at: now,
            },
        }
    }

    /// Asks for `cost` (>= 0) tokens at `now`. Cost 0 grants nothing and reports the bucket.
    pub fn take(&self, state: State, now: i64, cost: i64) -> Outcome {
        match self.algorithm {
            Algorithm::TokenBucket => self.take_token_bucket(state, now, cost),
            Algorithm::FixedWindow | Algorithm::SlidingWindow => self.take_window(state, now, cost),
            Algorithm::CalendarWindow => self.take_calendar(state, now, cost),
            // a slot is taken only with a lease id (`acquire_slot`): any take reports it
            Algorithm::Concurrency => self.slot_outcome(state, now),
            // a block bucket only reports; denials are counted with `count_denial`
            Algorithm::Block => self.block_outcome(state, now),
            Algorithm::Reservation => self.take_reservation(state, now, cost),
            // a limit changes only with a release's report (`adapt`): any take reports it
            Algorithm::AdaptiveLimit => self.limit_outcome(state, now),
        }
    }

    fn take_token_bucket(&self, state: State, now: i64, cost: i64) -> Outcome {
        let limit = &self.limit;
        let bucket = bucket_of(state);
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
        self.token_bucket_outcome(allowed, after, retry_after, now)
    }

    /// The outcome reporting the token bucket `after` at `now`.
    fn token_bucket_outcome(
        &self,
        allowed: bool,
        after: Bucket,
        retry_after: Option<i64>,
        now: i64,
    ) -> Outcome {
        let limit = &self.limit;
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
            remaining: (after.level / limit.ticks_per_token()).max(0),
            retry_after,
            reset_after: until(full_at, now),
        }
    }

    /// Whether the bucket is full at `now` (and so equal to a missing one: it may be deleted).
    pub fn is_full(&self, state: State, now: i64) -> bool {
        self.take(state, now, 0).reset_after == 0
    }

    /// The tokens available at `now` as an exact fraction `(numerator, denominator)`.
    pub fn tokens_exact(&self, state: State, now: i64) -> (i128, i128) {
        match self.algorithm {
            Algorithm::TokenBucket => {
                let level = bucket_of(state).level_at(&self.limit, now);
                (i128::from(level), i128::from(self.period_us()))
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let t = now;
                let (previous, current) = self.counts_at(state, t);
                let period = i128::from(self.period_us());
                let used = self.weighted_use(previous, current, t);
                (i128::from(self.burst()) * period - used, period)
            }
            Algorithm::CalendarWindow => (i128::from(self.calendar_tokens(state, now)), 1),
            Algorithm::Concurrency => (i128::from(self.slot_outcome(state, now).remaining), 1),
            Algorithm::Block => (i128::from(self.block_tokens(state, now)), 1),
            Algorithm::Reservation => (
                i128::from(self.reservation_outcome(state, now).remaining),
                1,
            ),
            // the limit in force, in leases
            Algorithm::AdaptiveLimit => (
                i128::from(self.limit_outcome(state, now).state.level),
                i128::from(adaptive::UNITS),
            ),
        }
    }

    /// The tokens available at `now` in millionths of a token, rounded down (for display).
    pub fn tokens_millionths(&self, state: State, now: i64) -> i64 {
        let (num, den) = self.tokens_exact(state, now);
        (num * 1_000_000)
            .div_euclid(den.max(1))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    /// Puts up to `tokens` back (a refund), never above the capacity.
    pub fn refund(&self, state: State, now: i64, tokens: i64) -> State {
        let tokens = tokens.max(0);
        match self.algorithm {
            Algorithm::TokenBucket => {
                let current = bucket_of(state).refilled(&self.limit, now);
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
            Algorithm::CalendarWindow => self.refund_calendar(state, now, tokens),
            // a lease is given back by releasing it, a reservation by settling it; a block is lifted by
            // deleting it
            Algorithm::Concurrency
            | Algorithm::Block
            | Algorithm::Reservation
            | Algorithm::AdaptiveLimit => state,
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
                let ticks = (num * i128::from(self.period_us()))
                    .div_euclid(den)
                    .clamp(i128::from(i64::MIN), i128::from(self.limit.full_level()))
                    as i64;
                State {
                    level: ticks,
                    at: t,
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                // a debt (negative tokens) stays a count above the limit, within what a window holds
                let available = num.div_euclid(den).clamp(
                    i128::from(self.burst() - MAX_WINDOW_COUNT),
                    i128::from(self.burst()),
                ) as i64;
                State {
                    level: self.burst() - available,
                    at: t,
                }
            }
            // a slot keeps its lease, expiring when it did under the numbers it was acquired with
            Algorithm::Concurrency if stored_policy.algorithm == Algorithm::Concurrency => State {
                level: stored.level,
                at: stored_policy
                    .lease_expiry(stored)
                    .saturating_sub(self.period_us()),
            },
            Algorithm::Concurrency => self.full(t),
            // a block keeps its end, and a count its window, whatever the policy's numbers became
            Algorithm::Block if stored_policy.algorithm == Algorithm::Block => stored,
            Algorithm::Block => self.full(t),
            // a reservation keeps its tokens and expires when it did, whatever hold it is read with
            Algorithm::Reservation if stored_policy.algorithm == Algorithm::Reservation => State {
                level: stored.level,
                at: stored_policy
                    .reservation_expiry(stored)
                    .saturating_sub(self.period_us()),
            },
            Algorithm::Reservation => self.full(t),
            // a limit keeps its level (within the new most leases) and its last decrease
            Algorithm::AdaptiveLimit if stored_policy.algorithm == Algorithm::AdaptiveLimit => {
                State {
                    level: stored
                        .level
                        .min(self.rate().saturating_mul(adaptive::UNITS)),
                    at: stored.at,
                }
            }
            Algorithm::AdaptiveLimit => self.full(t),
            Algorithm::CalendarWindow => {
                let available = num.div_euclid(den).clamp(
                    i128::from(self.burst() - MAX_WINDOW_COUNT),
                    i128::from(self.burst()),
                ) as i64;
                self.calendar_carried(stored, stored_policy, available, t)
            }
        }
    }
}

#[cfg(test)]
mod tests;
