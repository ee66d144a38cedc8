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

/// What separates a policy's name from the other namespaces the policy owns: its lease slots'
/// (`name U+001F slot`, [`crate::algorithm::slot_namespace`]) and its block buckets' (`name U+001F block`,
/// `name U+001F shadow block`, [`crate::algorithm::block_namespace`]). Policy names are printable ASCII, so
/// none contains it. The SQL that finds a policy's buckets (`sql/finalize.sql`'s view, `drop_policy`)
/// splits on it as `chr(31)`.
pub const POLICY_PART_SEPARATOR: char = '\u{1f}';

/// A namespace policy `policy` owns besides its own: `policy`, [`POLICY_PART_SEPARATOR`], `part`.
pub fn policy_part(policy: &str, part: &str) -> String {
    format!("{policy}{POLICY_PART_SEPARATOR}{part}")
}

/// The policy a policy namespace belongs to: the name before [`POLICY_PART_SEPARATOR`] (a lease slot's, a
/// block bucket's), or the whole name (the policy's own buckets).
pub fn owning_policy(namespace: &str) -> &str {
    namespace
        .split(POLICY_PART_SEPARATOR)
        .next()
        .unwrap_or(namespace)
}

/// What kind of bucket a namespace holds, as `rate_limit.buckets` and the statistics show it. The one
/// mapping between namespaces and kinds (`sql/finalize.sql`'s view spells the same for the table's rows;
/// a test compares them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A named policy's bucket.
    Policy,
    /// An ad-hoc limit's bucket.
    AdHoc,
    /// A bucket of `rate_limiting_request`.
    Request,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Policy, Kind::AdHoc, Kind::Request];

    /// The name shown for the kind: `policy`, `ad_hoc` or `request`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Policy => "policy",
            Kind::AdHoc => "ad_hoc",
            Kind::Request => "request",
        }
    }

    /// The kind and policy name of a namespace column value (see [`Namespace::stored_name`]).
    pub fn of_stored_name(name: &str) -> (Kind, Option<&str>) {
        match name {
            REQUEST_NAMESPACE => (Kind::Request, None),
            AD_HOC_NAMESPACE => (Kind::AdHoc, None),
            policy => (Kind::Policy, Some(policy)),
        }
    }
}

impl<'a> Namespace<'a> {
    /// The kind of bucket this namespace holds.
    pub fn kind(&self) -> Kind {
        match self {
            Namespace::Policy { .. } => Kind::Policy,
            Namespace::AdHoc => Kind::AdHoc,
            Namespace::Request => Kind::Request,
        }
    }

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

/// What a call asks of its buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `cost` tokens from every bucket, granted only if every bucket has them (cost 0 only reports).
    Take(i64),
    /// `cost` tokens whatever the bucket holds, down to `max_debt` tokens below zero: always granted (see
    /// [`Policy::charge`]).
    Charge {
        /// Tokens charged.
        cost: i64,
        /// How far below zero the bucket may go, in tokens.
        max_debt: i64,
    },
    /// `cost` tokens booked in a token bucket, first come first served, down to `max_debt` tokens below
    /// zero and no further than `max_delay` µs of refill: granted with the time the booked tokens exist,
    /// or denied (see [`Policy::book`](crate::algorithm::Policy::book)).
    Book {
        /// Tokens booked.
        cost: i64,
        /// How far below zero the bucket may go, in tokens.
        max_debt: i64,
        /// How long the caller waits at most, in µs.
        max_delay: i64,
    },
    /// `tokens` recorded in this bucket, a reservation's, as taken at `since` (a booking's: the instant
    /// its key's bucket was booked, so that the record is held until exactly the booking's time, whatever
    /// the store's clock reads a moment later).
    Record {
        /// Tokens recorded.
        tokens: i64,
        /// The instant the record is made as of, in µs.
        since: i64,
    },
    /// Lease `lease` in this bucket, a slot of a concurrency policy, if it is free (see
    /// [`Policy::acquire_slot`](crate::algorithm::Policy::acquire_slot)).
    Acquire {
        /// The lease's id (not 0).
        lease: i64,
    },
    /// Free this slot if it still holds lease `lease` (see
    /// [`Policy::release_slot`](crate::algorithm::Policy::release_slot)).
    Release {
        /// The lease's id.
        lease: i64,
    },
    /// Adapt this bucket, an adaptive concurrency policy's limit, to a released call's report (see
    /// [`Policy::adapt`](crate::algorithm::Policy::adapt)); allowed when the limit changed.
    Adapt {
        /// The policy's adaptive settings.
        settings: crate::algorithm::Adaptive,
        /// When the released lease was acquired, in µs.
        acquired_at: i64,
        /// The call's latency, in µs.
        latency_us: i64,
        /// How the call went.
        report: crate::algorithm::Report,
    },
    /// Count one denial of the key in this bucket, a block bucket, blocking the key for `block_for` µs at
    /// the penalty box's limit (see [`Policy::count_denial`](crate::algorithm::Policy::count_denial)).
    CountDenial {
        /// How long the block that the limit starts lasts, in µs.
        block_for: i64,
    },
    /// Block the key for `duration` µs, in this bucket, a block bucket (see
    /// [`Policy::block_for`](crate::algorithm::Policy::block_for)).
    Block {
        /// How long, in µs.
        duration: i64,
    },
}

impl Ask {
    /// Whether the call only reports (a take of 0 tokens), writing nothing.
    pub fn only_reports(&self) -> bool {
        matches!(self, Ask::Take(0))
    }
}

/// How a named policy's keys are blocked (see [`crate::algorithm::block`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// The numbers of a key's block bucket ([`Policy::block_bucket`]).
    pub bucket: Policy,
    /// The penalty box: how long (µs) the block lasts that `bucket.rate()` denials within one window
    /// start; `None` when the policy has no penalty box (its keys are blocked only by hand).
    pub penalty_for: Option<i64>,
    /// Whether a key may hold a block its penalty box did not make: one was blocked by hand, or the
    /// policy's penalty box was removed (the blocks it made then end as blocks by hand do).
    pub blocks_by_hand: bool,
}

impl Blocking {
    /// Whether a key of the policy may be blocked, so that a call must read its block bucket: with a
    /// penalty box, or once a key may hold a block by hand. Otherwise no block bucket can hold a block.
    pub fn may_be_blocked(&self) -> bool {
        self.penalty_for.is_some() || self.blocks_by_hand
    }
}

/// A key's answer fixed by a per-key override of its policy: the call is decided without its bucket,
/// which is neither read nor written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every call of the key is denied, until `until` (µs on the wall clock) or for ever.
    Deny {
        /// When the override ends; `None`: it does not.
        until: Option<i64>,
    },
    /// Every call of the key is granted, whatever it costs; nothing is taken.
    Exempt,
}

impl Verdict {
    /// The outcome of a call of the key at `now` under `policy`: denied with a `retry_after` of the
    /// override's end (`None` when it has none), or granted with the bucket's capacity left.
    pub fn outcome(&self, policy: &Policy, now: i64) -> Outcome {
        match *self {
            Verdict::Deny { until } => {
                let retry_after = until.map(|u| u.saturating_sub(now).max(0));
                Outcome {
                    allowed: false,
                    state: State { level: 0, at: now },
                    remaining: 0,
                    retry_after,
                    reset_after: retry_after.unwrap_or(0),
                }
            }
            Verdict::Exempt => Outcome {
                allowed: true,
                state: policy.full(now),
                remaining: policy.burst(),
                retry_after: None,
                reset_after: 0,
            },
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
    /// Shadow mode: this bucket never denies the call. It is evaluated like any other, takes its tokens when
    /// it has them, and its would-be denials are reported and counted (see [`granted`]).
    pub shadow: bool,
    /// How the key may be blocked: a named policy's bucket; `None` for buckets that are never blocked
    /// (ad-hoc and request buckets, lease slots, block buckets themselves).
    pub blocking: Option<Blocking>,
    /// The key's fixed answer under an override of its policy (deny or exempt), if it has one: the
    /// stores never see such a target ([`Verdict`]).
    pub verdict: Option<Verdict>,
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

    /// Charges `cost` tokens at `now` against `stored`, down to `max_debt` tokens of debt: always allowed
    /// (see [`Policy::charge`]).
    pub fn charge(&self, stored: Option<Stored>, now: i64, cost: i64, max_debt: i64) -> Outcome {
        self.policy
            .charge(self.current(stored, now), now, cost, max_debt)
    }

    /// Answers `ask` at `now` against `stored`.
    pub fn answer(&self, stored: Option<Stored>, now: i64, ask: Ask) -> Outcome {
        match ask {
            Ask::Take(cost) => self.evaluate(stored, now, cost),
            Ask::Charge { cost, max_debt } => self.charge(stored, now, cost, max_debt),
            Ask::Book {
                cost,
                max_debt,
                max_delay,
            } => {
                let current = self.current(stored, now);
                match self.policy.book(current, now, cost, max_debt, max_delay) {
                    Some(booking) => booking.outcome,
                    // only a token bucket books: any other bucket denies, writing nothing new
                    None => Outcome {
                        allowed: false,
                        retry_after: None,
                        ..self.policy.take(current, now, 0)
                    },
                }
            }
            Ask::Record { tokens, since } => self.evaluate(stored, since, tokens),
            Ask::Acquire { lease } => self
                .policy
                .acquire_in(self.current(stored, now), now, lease),
            Ask::Release { lease } => self
                .policy
                .release_in(self.current(stored, now), now, lease),
            Ask::Adapt {
                settings,
                acquired_at,
                latency_us,
                report,
            } => self.policy.adapt(
                self.current(stored, now),
                now,
                settings,
                acquired_at,
                latency_us,
                report,
            ),
            Ask::CountDenial { block_for } => {
                self.policy
                    .count_denial(self.current(stored, now), now, block_for)
            }
            Ask::Block { duration } => self.policy.block_for(now, duration),
        }
    }

    /// Whether two targets name the same bucket.
    pub fn same_bucket(&self, other: &Target<'_>) -> bool {
        self.namespace.stored_name() == other.namespace.stored_name() && self.key == other.key
    }
}

/// Whether a call with these outcomes (`outcomes[i]` is `targets[i]`'s) is granted: every bucket that is
/// not in shadow mode allowed it. The store then writes the state of every allowed outcome and nothing
/// else: a bucket in shadow mode that would have denied keeps its state, as a denial leaves it.
pub fn granted(targets: &[Target<'_>], outcomes: &[Outcome]) -> bool {
    targets
        .iter()
        .zip(outcomes)
        .all(|(t, o)| o.allowed || t.shadow)
}

/// The most targets one call may name (the memory store locks one partition per target).
pub const MAX_TARGETS: usize = 16;

/// Evaluates `cost` tokens at `now` for every target against its stored bucket (`stored[i]` is target
/// `i`'s): the decision every store makes between reading its buckets and writing them. The call is
/// granted only if every outcome is allowed.
pub fn evaluate_all(
    targets: &[Target<'_>],
    stored: &[Option<Stored>],
    now: i64,
    cost: i64,
) -> Vec<Outcome> {
    targets
        .iter()
        .zip(stored)
        .map(|(t, s)| t.evaluate(*s, now, cost))
        .collect()
}

/// [`evaluate_all`] with a cost per target: `costs[i]` tokens of target `i`.
pub fn evaluate_costs(
    targets: &[Target<'_>],
    stored: &[Option<Stored>],
    now: i64,
    costs: &[i64],
) -> Vec<Outcome> {
    targets
        .iter()
        .zip(stored)
        .zip(costs)
        .map(|((t, s), cost)| t.evaluate(*s, now, *cost))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_back_from_its_namespace_column() {
        let policy = Namespace::Policy {
            name: "api",
            created_at: 5,
        };
        for ns in [policy, Namespace::AdHoc, Namespace::Request] {
            let (kind, name) = Kind::of_stored_name(ns.stored_name());
            assert_eq!(kind, ns.kind());
            assert_eq!(name, ns.policy_name());
        }
        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["policy", "ad_hoc", "request"]);
    }

    #[test]
    fn every_namespace_a_policy_owns_names_it_first() {
        use crate::algorithm::{block_namespace, shadow_block_namespace, slot_namespace};
        for owned in [
            "api".to_string(),
            block_namespace("api"),
            shadow_block_namespace("api"),
            slot_namespace("api", 0),
            slot_namespace("api", 999),
        ] {
            assert_eq!(owning_policy(&owned), "api", "{owned:?}");
        }
        assert_eq!(block_namespace("api"), "api\u{1f}block");
        assert_eq!(slot_namespace("api", 7), "api\u{1f}7");
    }

    #[test]
    fn an_override_denies_until_its_end_or_exempts_with_the_capacity_left() {
        let p = crate::algorithm::Policy::new(
            crate::algorithm::Algorithm::TokenBucket,
            2,
            1_000_000,
            5,
        )
        .unwrap();
        let denied = Verdict::Deny {
            until: Some(3_000_000),
        }
        .outcome(&p, 1_000_000);
        assert_eq!(
            (denied.allowed, denied.remaining, denied.retry_after),
            (false, 0, Some(2_000_000))
        );
        let for_ever = Verdict::Deny { until: None }.outcome(&p, 0);
        assert_eq!((for_ever.allowed, for_ever.retry_after), (false, None));
        let exempt = Verdict::Exempt.outcome(&p, 0);
        assert_eq!(
            (exempt.allowed, exempt.remaining, exempt.retry_after),
            (true, 5, None)
        );
    }

    #[test]
    fn a_call_is_decided_bucket_by_bucket() {
        let p = crate::algorithm::Policy::new(
            crate::algorithm::Algorithm::TokenBucket,
            2,
            1_000_000,
            2,
        )
        .unwrap();
        let t = |key| Target {
            namespace: Namespace::AdHoc,
            key,
            policy: p,
            changed_at: i64::MIN,
            shadow: key == "b",
            blocking: None,
            verdict: None,
        };
        let empty = Stored {
            state: p.take(p.full(0), 0, 2).state,
            policy: p,
        };
        let outcomes = evaluate_all(&[t("a"), t("b")], &[None, Some(empty)], 0, 1);
        assert!(outcomes[0].allowed);
        assert!(!outcomes[1].allowed);
        // "b" is in shadow mode: its denial does not deny the call
        assert!(granted(&[t("a"), t("b")], &outcomes));
        assert!(!granted(&[t("b"), t("a")], &[outcomes[0], outcomes[1]]));
    }
}
