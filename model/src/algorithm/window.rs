//! The window algorithms (fixed and sliding): counts per aligned window, the sliding estimate, and when a
//! denied cost fits again. A second `impl Policy`, beside the token bucket's arithmetic in the parent.

use super::{pack, unpack, until, Algorithm, Outcome, Policy, State};

impl Policy {
    pub(super) fn window_index(&self, t: i64) -> i64 {
        t.div_euclid(self.period_us())
    }

    /// `(previous, current)` counts of the window containing `t`. A `t` before `state.at` (the clock
    /// stepped back) keeps the counts as they were at `state.at`: no time elapsed.
    pub(super) fn counts_at(&self, state: State, t: i64) -> (i64, i64) {
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
            Algorithm::TokenBucket
            | Algorithm::CalendarWindow
            | Algorithm::Concurrency
            | Algorithm::Block
            | Algorithm::Reservation
            | Algorithm::AdaptiveLimit => (0, 0),
        }
    }

    /// The used amount of a window state at `t`, times `period_us` (exact): the sliding estimate
    /// `previous × (period − elapsed) + current × period`, or `current × period` for a fixed window.
    pub(super) fn weighted_use(&self, previous: i64, current: i64, t: i64) -> i128 {
        let period = i128::from(self.period_us());
        let elapsed = i128::from(t.rem_euclid(self.period_us()));
        i128::from(previous) * (period - elapsed) + i128::from(current) * period
    }

    pub(super) fn take_window(&self, state: State, now: i64, cost: i64) -> Outcome {
        let t = now;
        let period = i128::from(self.period_us());
        let burst = i128::from(self.burst());
        let (previous, current) = self.counts_at(state, t);
        let used = self.weighted_use(previous, current, t);
        let allowed = used + i128::from(cost) * period <= burst * period;
        let current_after = if allowed { current + cost } else { current };
        let retry_after = if allowed || cost > self.burst() {
            None
        } else {
            Some(until(self.window_retry(previous, current, t, cost), now))
        };
        self.window_outcome(allowed, previous, current_after, retry_after, t)
    }

    /// The outcome reporting window counts `(previous, current)` at `t`.
    pub(super) fn window_outcome(
        &self,
        allowed: bool,
        previous: i64,
        current: i64,
        retry_after: Option<i64>,
        t: i64,
    ) -> Outcome {
        let period = i128::from(self.period_us());
        let burst = i128::from(self.burst());
        let used = self.weighted_use(previous, current, t);
        let remaining = ((burst * period - used).max(0) / period) as i64;
        let next_start = i128::from(self.window_index(t)) * period + period;
        let full_at = if current > 0 {
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
            Algorithm::SlidingWindow => pack(previous, current),
            _ => current,
        };
        Outcome {
            allowed,
            state: State { level, at: t },
            remaining,
            retry_after,
            reset_after: until(full_at, t),
        }
    }

    /// The first instant at or after `t` at which `cost` (<= burst) tokens fit, for window counts
    /// `(previous, current)` at `t`, if nobody takes any.
    pub(super) fn window_retry(&self, previous: i64, current: i64, t: i64, cost: i64) -> i128 {
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
}
