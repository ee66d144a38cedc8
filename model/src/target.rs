//! What a call asks of a store: the buckets it touches and how each is evaluated. Shared by the table and
//! memory stores so that both decide with exactly the same arithmetic.
//!
//! A bucket is `(namespace, key)`. The namespaces are each named policy, the ad-hoc limits (one namespace
//! for all of them), and the buckets of `rate_limiting_request`; a bucket of one namespace is never a bucket
//! of another.

use crate::algorithm::{Outcome, Policy, State};

/// The namespace of a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace<'a> {
    /// A named policy: its name and creation time (µs). The memory store keys buckets by the policy's
    /// incarnation, so a dropped and re-created policy starts from full buckets.
    Policy {
        /// The policy's name.
        name: &'a str,
        /// When it was created.
        created_at: i64,
    },
    /// The ad-hoc limits of `rate_limit.take_ad_hoc`.
    AdHoc,
    /// The buckets of `rate_limiting_request`.
    Request,
}

/// The namespace column of `rate_limit.bucket_state` for ad-hoc buckets. `#` cannot start a policy name.
pub const AD_HOC_NAMESPACE: &str = "#ad_hoc";
/// The namespace column of `rate_limit.bucket_state` for `rate_limiting_request`'s buckets.
pub const REQUEST_NAMESPACE: &str = "#request";

impl<'a> Namespace<'a> {
    /// The value of the namespace column: the policy's name, or one of the `#` names above.
    pub fn stored_name(&self) -> &'a str {
        match self {
            Namespace::Policy { name, .. } => name,
            Namespace::AdHoc => AD_HOC_NAMESPACE,
            Namespace::Request => REQUEST_NAMESPACE,
        }
    }

    /// The policy's name, for a decision; `None` for ad-hoc and request buckets.
    pub fn policy_name(&self) -> Option<&'a str> {
        match self {
            Namespace::Policy { name, .. } => Some(name),
            Namespace::AdHoc | Namespace::Request => None,
        }
    }

    /// The policy's creation time, 0 for the other namespaces.
    pub fn created_at(&self) -> i64 {
        match self {
            Namespace::Policy { created_at, .. } => *created_at,
            Namespace::AdHoc | Namespace::Request => 0,
        }
    }
}

/// Tokens asked of one bucket.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The bucket's namespace.
    pub namespace: Namespace<'a>,
    /// The bucket's key.
    pub key: &'a str,
    /// The numbers that apply now.
    pub policy: Policy,
    /// When those numbers took effect (µs); `i64::MIN` for ad-hoc and request limits, which apply from the
    /// bucket's last update.
    pub changed_at: i64,
}

/// A stored bucket with the numbers it was last written under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

    /// A refund of up to `tokens` to `stored` at `now` (never above the capacity): the state the store
    /// writes (`None` for a missing bucket, which is full: nothing to put back, nothing to write) and the
    /// bucket afterwards. Both stores refund through it, between their own read and write.
    pub fn refund(
        &self,
        stored: Option<Stored>,
        now: i64,
        tokens: i64,
    ) -> (Option<State>, Outcome) {
        match stored {
            None => (None, self.evaluate(None, now, 0)),
            Some(s) => {
                let state = self.policy.refund(self.current(Some(s), now), now, tokens);
                (Some(state), self.policy.take(state, now, 0))
            }
        }
    }

    /// Whether two targets name the same bucket.
    pub fn same_bucket(&self, other: &Target<'_>) -> bool {
        self.namespace.stored_name() == other.namespace.stored_name() && self.key == other.key
    }
}

/// The most targets one call may name (the memory store locks one partition per target).
pub const MAX_TARGETS: usize = 16;
