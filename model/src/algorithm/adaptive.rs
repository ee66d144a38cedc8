//! Adaptive concurrency: a concurrency limit per key that follows what the calls it admits report when
//! they release their lease (additive increase, multiplicative decrease, as TCP's congestion window).
//!
//! A concurrency policy with fixed leases admits up to `rate` calls at once whatever the backend behind
//! them can take. An adaptive one admits up to its key's *limit*, between `min` and `max` (the policy's
//! `rate`, so that every slot a lease can take exists): each release reports how the call went (an
//! [`Report`], and its latency: the caller's figure, or how long the lease was held).
//! - A call that went well (`ok`, latency at most the target) adds `1 / limit` to the limit: one lease
//!   more per round of `limit` good calls, never above `max`.
//! - A call that went badly (dropped, timed out, or slower than the target) multiplies the limit by
//!   [`BACKOFF`], never below `min`, once per round: only a call whose lease was acquired at or after the
//!   last decrease can decrease it again, so the calls that were already running at the older, higher
//!   limit (and are slow for that very reason) do not each cut it once more.
//!
//! The limit lives in a bucket of its own beside the key's lease slots (namespace [`limit_namespace`], its
//! state below, algorithm [`Algorithm::AdaptiveLimit`] with the numbers `max` leases per lease TTL),
//! shared by every backend and every application server that calls the database, as every other bucket
//! is. A missing limit bucket is at `max` (as a missing bucket is full for every algorithm): a new key
//! behaves as a fixed concurrency policy of `max` leases until its calls report trouble, and the purge may
//! delete a limit that is back at `max`.
//!
//! A limit is also forgotten (back at `max`, full, so that the purge deletes it) one lease TTL after its
//! last decrease, as TCP restarts its window after an idle spell: a key whose calls still meet trouble is
//! cut again within one round (every round is shorter than the TTL, which bounds how long a call may hold
//! its lease), and a key without trouble for that long would have climbed back by itself if it had load.
//! Without it a limit cut once would stay in the store for ever, a row per key that any caller of the
//! policy could leave behind (docs/security.md's bounds table).
//!
//! A decrease applies to the leases acquired after it: an acquire takes only a slot below the key's
//! limit, so the leases in slots below it never exceed it; a lease held in a slot above a lowered limit is
//! kept until it is released or expires (the calls already running finish), and its slot is not taken
//! again while the limit stays below it.
//!
//! | field   | meaning                                                                              |
//! | ------- | ------------------------------------------------------------------------------------ |
//! | `level` | the limit in thousandths of a lease ([`UNITS`]), so that `1 / limit` adds up exactly |
//! | `at`    | the instant of the limit's last decrease (every stored limit has had one)            |

use super::{until, Algorithm, Outcome, Policy, State};

/// Thousandths of a lease: the limit's unit in its state.
pub const UNITS: i64 = 1000;

/// The factor of a decrease, as a fraction: 9/10.
pub const BACKOFF: (i64, i64) = (9, 10);

/// How a call admitted by an adaptive concurrency policy went, as its release reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// Served: its latency decides whether it counts as good.
    Ok,
    /// Refused or shed by the backend (an HTTP 429 or 503, a connection refused).
    Dropped,
    /// Given up by the caller before the backend answered.
    TimedOut,
}

impl Report {
    /// The report named `name` (`ok`, `dropped`, `timeout`), or `None`.
    pub fn parse(name: &str) -> Option<Report> {
        match name {
            "ok" => Some(Report::Ok),
            "dropped" => Some(Report::Dropped),
            "timeout" => Some(Report::TimedOut),
            _ => None,
        }
    }
}

/// Why an adaptive concurrency policy's settings were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdaptiveError {
    /// `min` is below 1 or above `max`.
    Min,
    /// `max` is below 1 or above [`super::MAX_LEASES`].
    Max,
    /// The latency target is not positive.
    Target,
}

/// An adaptive concurrency policy's settings: the limit stays between `min` and `max` leases; a call
/// slower than `target_us` microseconds counts as trouble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adaptive {
    min: i64,
    max: i64,
    target_us: i64,
}

impl Adaptive {
    /// Settings of a limit between `min` and `max` leases with a latency target of `target_us`.
    pub fn new(min: i64, max: i64, target_us: i64) -> Result<Adaptive, AdaptiveError> {
        if !(1..=super::MAX_LEASES).contains(&max) {
            return Err(AdaptiveError::Max);
        }
        if !(1..=max).contains(&min) {
            return Err(AdaptiveError::Min);
        }
        if target_us <= 0 {
            return Err(AdaptiveError::Target);
        }
        Ok(Adaptive {
            min,
            max,
            target_us,
        })
    }

    /// The fewest leases the limit allows.
    pub fn min(&self) -> i64 {
        self.min
    }

    /// The most leases the limit allows (the policy's `rate`, its number of slots).
    pub fn max(&self) -> i64 {
        self.max
    }

    /// The latency above which a call counts as trouble, in microseconds.
    pub fn target_us(&self) -> i64 {
        self.target_us
    }

    /// The leases a key may hold at once with limit bucket `stored` (`None`: missing, at `max`).
    pub fn limit(&self, stored: Option<State>) -> i64 {
        stored.map_or(self.max, |s| (s.level / UNITS).clamp(self.min, self.max))
    }

    /// The limit bucket after a release of a lease acquired at `acquired_at` reported `report` and a
    /// latency of `latency_us`, at `now`: `Some` new state to write, or `None` when nothing changes (a
    /// good call at `max`, or a bad one of a round already answered by a decrease).
    pub fn after_release(
        &self,
        stored: Option<State>,
        acquired_at: i64,
        now: i64,
        latency_us: i64,
        report: Report,
    ) -> Option<State> {
        let top = self.max * UNITS;
        let (level, last_decrease) = stored.map_or((top, i64::MIN), |s| {
            (s.level.clamp(self.min * UNITS, top), s.at)
        });
        let trouble = report != Report::Ok || latency_us > self.target_us;
        if trouble {
            if acquired_at < last_decrease {
                return None;
            }
            let cut = i128::from(level) * i128::from(BACKOFF.0) / i128::from(BACKOFF.1);
            let level = i64::try_from(cut).unwrap_or(top).max(self.min * UNITS);
            return Some(State { level, at: now });
        }
        if level >= top {
            return None;
        }
        // one lease more per `limit` good calls: UNITS / (level / UNITS) thousandths each, at least one
        let step = (UNITS * UNITS / level).max(1);
        Some(State {
            level: (level + step).min(top),
            at: last_decrease,
        })
    }
}

/// The namespace of the adaptive limits of policy `policy`'s keys: the policy's name, U+001F and
/// `adaptive limit` (the key stays the caller's, so that a key's limit lives where its slots do).
pub fn limit_namespace(policy: &str) -> String {
    crate::target::policy_part(policy, "adaptive limit")
}

impl Policy {
    /// The numbers of the limit buckets of an adaptive concurrency policy of `max` leases expiring
    /// `lease_ttl_us` after their acquisition.
    pub fn adaptive_limit(max: i64, lease_ttl_us: i64) -> Result<Policy, super::PolicyError> {
        Policy::new(Algorithm::AdaptiveLimit, max, lease_ttl_us, max)
    }

    /// Limit bucket `state` as it counts at `now`: `None` when it is at its most leases or forgotten (one
    /// lease TTL after its last decrease), as a missing one.
    pub fn limit_in_force(&self, state: State, now: i64) -> Option<State> {
        let top = self.rate().saturating_mul(UNITS);
        let forgotten = now >= state.at.saturating_add(self.period_us());
        (state.level < top && !forgotten).then_some(state)
    }

    /// Limit bucket `state` at `now`, as one bucket's outcome: always allowed, `remaining` the leases the
    /// limit allows, `reset_after` until it is forgotten (0 when it is at its most, a full bucket).
    pub fn limit_outcome(&self, state: State, now: i64) -> Outcome {
        match self.limit_in_force(state, now) {
            Some(held) => Outcome {
                allowed: true,
                state: held,
                remaining: held.level / UNITS,
                retry_after: None,
                reset_after: until(i128::from(held.at) + i128::from(self.period_us()), now),
            },
            None => Outcome {
                allowed: true,
                state: self.full(now),
                remaining: self.rate(),
                retry_after: None,
                reset_after: 0,
            },
        }
    }

    /// The limit bucket `state` after a release at `now` of a lease acquired at `acquired_at` reported
    /// `report` with a latency of `latency_us`, under `settings` ([`Adaptive::after_release`]), as one
    /// bucket's outcome: allowed with the state to write when the limit changed, denied with the bucket
    /// as it is when nothing changes (a store writes nothing then).
    pub fn adapt(
        &self,
        state: State,
        now: i64,
        settings: Adaptive,
        acquired_at: i64,
        latency_us: i64,
        report: Report,
    ) -> Outcome {
        let stored = self.limit_in_force(state, now);
        match settings.after_release(stored, acquired_at, now, latency_us, report) {
            Some(new) if new.level < self.rate().saturating_mul(UNITS) => Outcome {
                allowed: true,
                ..self.limit_outcome(new, now)
            },
            // back at its most: full, as a missing limit
            Some(_) => Outcome {
                allowed: true,
                ..self.limit_outcome(self.full(now), now)
            },
            None => Outcome {
                allowed: false,
                ..self.limit_outcome(state, now)
            },
        }
    }
}

#[cfg(test)]
mod tests;
