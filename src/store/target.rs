//! What a policy or ad-hoc call asks of a store: the buckets it touches and how each is evaluated. Shared by
//! the table and memory stores so that both decide with exactly the same arithmetic.

use crate::algorithm::{Algorithm, Outcome, Policy, State};

/// Tokens asked of one bucket.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The policy's name, or `""` for an ad-hoc limit (ad-hoc buckets share one namespace).
    pub policy_name: &'a str,
    /// When the policy was created (µs); 0 for ad-hoc. The memory store keys buckets by the policy's
    /// incarnation, so a dropped and re-created policy starts from full buckets.
    pub created_at: i64,
    /// The bucket's key.
    pub key: &'a str,
    /// The numbers that apply now.
    pub policy: Policy,
    /// When those numbers took effect (µs); `i64::MIN` for ad-hoc limits, which apply from the bucket's
    /// last update.
    pub changed_at: i64,
}

/// A stored bucket with the numbers it was last written under.
#[derive(Clone, Copy, Debug)]
pub struct Stored {
    /// The state.
    pub state: State,
    /// The policy numbers of that state.
    pub policy: Policy,
}

impl Target<'_> {
    /// The state under the current numbers at `now`: the stored one carried over, or a full bucket.
    pub fn current(&self, stored: Option<Stored>, now: i64) -> State {
        match stored {
            Some(s) => self
                .policy
                .carry_over(s.state, &s.policy, self.changed_at, now),
            None => self.policy.full(now),
        }
    }

    /// Evaluates `cost` tokens at `now` against `stored`.
    pub fn evaluate(&self, stored: Option<Stored>, now: i64, cost: i64) -> Outcome {
        self.policy.take(self.current(stored, now), now, cost)
    }
}

/// The stored numbers of a row or slot as a policy, if they are valid.
pub fn stored_policy(
    algorithm: Algorithm,
    rate: i64,
    period_us: i64,
    burst: i64,
) -> Option<Policy> {
    Policy::new(algorithm, rate, period_us, burst).ok()
}

/// The most targets one call may name (the memory store locks one partition per target).
pub const MAX_TARGETS: usize = 16;
