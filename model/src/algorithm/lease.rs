//! Concurrency leases: at most `rate` leases of a key held at once, each expiring `period_us` after it was
//! acquired (so a client that crashed cannot keep one), or released before that by its holder.
//!
//! A key's leases live in `rate` slots, each a bucket of its own whose state is one lease: `level` its id
//! (0: the slot is free) and `at` the instant it was acquired (so `at` is the last instant the bucket moved,
//! as the stores expect of every bucket); it expires `period_us` later. Acquiring takes a slot that is free or whose lease
//! has expired ([`Policy::acquire_slot`]); releasing frees the slot that still holds that id
//! ([`Policy::release_slot`]). A store that changes one slot's state atomically (a compare-and-swap, a row
//! lock) therefore never lets more than `rate` leases be held: each held lease occupies a slot of its own,
//! and a slot holds one lease. [`leases_outcome`] turns the slots an acquire saw into its decision.
//!
//! Lease ids are chosen by the caller (random, never 0): an id names one acquisition, so a release after the
//! lease expired and its slot was taken again frees nothing.

use super::*;

/// The most leases a concurrency policy may allow per key: an acquire probes up to that many slots.
pub const MAX_LEASES: i64 = 1000;

impl Policy {
    /// When the lease of slot `state` expires (its acquisition plus the policy's `period_us`).
    pub fn lease_expiry(&self, state: State) -> i64 {
        state.at.saturating_add(self.period_us())
    }

    /// Whether slot `state` holds a lease at `now`.
    pub fn slot_held(&self, state: State, now: i64) -> bool {
        state.level != 0 && now < self.lease_expiry(state)
    }

    /// Lease `lease` (not 0) in slot `state` at `now`, expiring `period_us` later: the slot's new state,
    /// or `None` while it holds an unexpired lease.
    pub fn acquire_slot(&self, state: State, now: i64, lease: i64) -> Option<State> {
        (lease != 0 && !self.slot_held(state, now)).then_some(State {
            level: lease,
            at: now,
        })
    }

    /// Releases lease `lease` from slot `state` at `now`: the free slot, or `None` when the slot does not
    /// hold that lease any more (released, expired, or taken again since).
    pub fn release_slot(&self, state: State, now: i64, lease: i64) -> Option<State> {
        (lease != 0 && state.level == lease && self.slot_held(state, now))
            .then_some(State { level: 0, at: now })
    }

    /// An acquire of lease `lease` in slot `state` at `now`, as one bucket's outcome: allowed with the
    /// slot's new state, or denied with its current one (see [`Policy::slot_outcome`]).
    pub fn acquire_in(&self, state: State, now: i64, lease: i64) -> Outcome {
        match self.acquire_slot(state, now, lease) {
            Some(held) => Outcome {
                allowed: true,
                state: held,
                remaining: 0,
                retry_after: None,
                reset_after: until(self.lease_expiry(held).into(), now),
            },
            None => Outcome {
                allowed: false,
                ..self.slot_outcome(state, now)
            },
        }
    }

    /// A release of lease `lease` from slot `state` at `now`, as one bucket's outcome: allowed (released)
    /// with the free slot, or denied with the slot as it is.
    pub fn release_in(&self, state: State, now: i64, lease: i64) -> Outcome {
        match self.release_slot(state, now, lease) {
            Some(free) => Outcome {
                allowed: true,
                ..self.slot_outcome(free, now)
            },
            None => Outcome {
                allowed: false,
                ..self.slot_outcome(state, now)
            },
        }
    }

    /// One slot, reported as a bucket of capacity 1: a free slot is full (so a store may delete it), a
    /// held one is empty until its lease expires.
    pub fn slot_outcome(&self, state: State, now: i64) -> Outcome {
        let held = self.slot_held(state, now);
        let expires = until(self.lease_expiry(state).into(), now);
        Outcome {
            allowed: !held,
            state: if held {
                state
            } else {
                State { level: 0, at: now }
            },
            remaining: i64::from(!held),
            retry_after: held.then_some(expires),
            reset_after: if held { expires } else { 0 },
        }
    }
}

/// Bits of a lease id that name its slot ([`MAX_LEASES`] slots fit).
const SLOT_BITS: u32 = 10;

/// The id of a lease in slot `slot` (below [`MAX_LEASES`]), from `random` (any bits): never 0, positive,
/// and its slot readable back ([`slot_of`]), so that a release goes straight to its slot.
pub fn lease_id(random: u64, slot: i64) -> i64 {
    // 52 random bits, plus 1 so that the id is never 0, then the slot: at most 2^62 + 1023
    let high = i64::try_from(random >> 12).unwrap_or(0) + 1;
    (high << SLOT_BITS) | slot.clamp(0, MAX_LEASES - 1)
}

/// The slot a lease id names.
pub fn slot_of(lease: i64) -> i64 {
    lease & ((1 << SLOT_BITS) - 1)
}

/// The namespace of slot `slot` of policy `policy`'s keys: the policy's name, U+001F and the slot number.
/// No policy is called that (policy names are printable ASCII), and the key stays the caller's, so a key's
/// slots live where its other buckets do (the same Citus shard).
pub fn slot_namespace(policy: &str, slot: i64) -> String {
    crate::target::policy_part(policy, &slot.to_string())
}

/// The decision of an acquire (or a report) over the slots of a key it tried (every one, or those below
/// an adaptive limit) as it left them at `now`: `allowed` whether this call got a lease; `remaining` the
/// slots of those still free; `retry_after` (denied) until the first
/// lease expires, the latest a slot frees if nobody releases one; `reset_after` until the last one expires.
/// `state` is the granted slot's (for the caller's lease id and expiry) or a free slot's.
pub fn leases_outcome(
    policy: &Policy,
    slots: &[State],
    now: i64,
    allowed: bool,
    granted: Option<State>,
) -> Outcome {
    let held: Vec<i64> = slots
        .iter()
        .filter(|s| policy.slot_held(**s, now))
        .map(|s| policy.lease_expiry(*s))
        .collect();
    let first = held.iter().min().map(|&at| until(at.into(), now));
    let last = held.iter().max().map_or(0, |&at| until(at.into(), now));
    let held = i64::try_from(held.len()).unwrap_or(i64::MAX);
    Outcome {
        allowed,
        state: granted.unwrap_or(State { level: 0, at: now }),
        remaining: (i64::try_from(slots.len()).unwrap_or(i64::MAX) - held).max(0),
        retry_after: if allowed { None } else { first },
        reset_after: last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: i64 = 1_000_000;

    fn jobs(n: i64) -> Policy {
        Policy::new(Algorithm::Concurrency, n, 30 * S, n).expect("valid")
    }

    /// An acquire as a store makes it: the first free slot, in order.
    fn acquire(p: &Policy, slots: &mut [State], now: i64, lease: i64) -> Outcome {
        let granted = slots
            .iter_mut()
            .find_map(|s| p.acquire_slot(*s, now, lease).inspect(|new| *s = *new));
        leases_outcome(p, slots, now, granted.is_some(), granted)
    }

    fn release(p: &Policy, slots: &mut [State], now: i64, lease: i64) -> bool {
        slots
            .iter_mut()
            .any(|s| p.release_slot(*s, now, lease).map(|new| *s = new).is_some())
    }

    #[test]
    fn three_leases_then_a_denial_until_the_first_expires() {
        let p = jobs(3);
        let mut slots = vec![p.full(0); 3];
        let t = 100 * S;
        for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
            let o = acquire(&p, &mut slots, t + i as i64 * S, 10 + i as i64);
            assert!(o.allowed);
            assert_eq!(o.remaining, remaining);
            assert_eq!(
                o.state,
                State {
                    level: 10 + i as i64,
                    at: t + i as i64 * S
                }
            );
        }
        let denied = acquire(&p, &mut slots, t + 5 * S, 99);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, Some(25 * S));
        assert_eq!(denied.reset_after, 27 * S);
        // the first lease expires 30 s after it was acquired: its slot is taken again
        assert!(!acquire(&p, &mut slots, t + 30 * S - 1, 99).allowed);
        assert!(acquire(&p, &mut slots, t + 30 * S, 99).allowed);
        // the expired lease cannot release the slot its successor holds
        let later = t + 30 * S + S / 2;
        assert!(!release(&p, &mut slots, later, 10));
        assert!(release(&p, &mut slots, later, 11));
        assert!(!release(&p, &mut slots, later, 11), "released once");
        assert_eq!(acquire(&p, &mut slots, later, 7).remaining, 0);
    }

    #[test]
    fn lease_ids_are_positive_never_zero_and_name_their_slot() {
        for random in [0, 1, u64::MAX, 0x0123_4567_89ab_cdef] {
            for slot in [0, 1, 999] {
                let id = lease_id(random, slot);
                assert!(id > 0, "{random} {slot}");
                assert_eq!(slot_of(id), slot);
            }
        }
        assert_ne!(lease_id(1 << 12, 3), lease_id(2 << 12, 3));
        assert_eq!(slot_namespace("jobs", 7), "jobs\u{1f}7");
    }

    #[test]
    fn a_held_lease_keeps_its_expiry_when_the_ttl_changes() {
        let short = jobs(2);
        let long = Policy::new(Algorithm::Concurrency, 2, 90 * S, 2).expect("valid");
        let held = short.acquire_slot(short.full(0), 10 * S, 5).expect("free");
        let carried = long.carry_over(held, &short, 20 * S, 20 * S);
        assert_eq!(long.lease_expiry(carried), 40 * S);
        assert!(long.slot_held(carried, 40 * S - 1));
        assert!(!long.slot_held(carried, 40 * S));
        // a free slot stays free
        assert!(!long.slot_held(
            long.carry_over(short.full(0), &short, 20 * S, 20 * S),
            20 * S
        ));
    }

    #[test]
    fn a_lease_id_of_zero_is_never_granted_nor_released() {
        let p = jobs(1);
        assert_eq!(p.acquire_slot(p.full(0), 0, 0), None);
        assert_eq!(p.release_slot(State { level: 0, at: 5 }, 0, 0), None);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Acquire,
        /// Release the n-th lease granted so far (modulo their number).
        Release(usize),
        Wait(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Acquire),
            2 => (0..64_usize).prop_map(Op::Release),
            2 => (0..(20 * S)).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Against a slow model (the live leases and their expiries): an acquire is granted exactly while
        /// fewer than `rate` leases are live, a release frees exactly a live lease, and the slots never
        /// hold more than `rate`.
        #[test]
        fn slots_hold_exactly_the_live_leases(n in 1..8_i64, ttl in 1..(60 * S), ops in prop::collection::vec(op(), 1..200)) {
            let p = Policy::new(Algorithm::Concurrency, n, ttl, n).expect("valid");
            let mut slots = vec![p.full(0); n as usize];
            let mut live: Vec<(i64, i64)> = Vec::new(); // (lease, expires at)
            let mut granted: Vec<i64> = Vec::new();
            let mut now = 0;
            let mut next_id = 1;
            for op in ops {
                live.retain(|&(_, at)| now < at);
                match op {
                    Op::Acquire => {
                        let o = acquire(&p, &mut slots, now, next_id);
                        prop_assert_eq!(o.allowed, (live.len() as i64) < n);
                        if o.allowed {
                            live.push((next_id, now + ttl));
                            granted.push(next_id);
                        } else {
                            let first = live.iter().map(|&(_, at)| at).min().map(|at| at - now);
                            prop_assert_eq!(o.retry_after, first);
                        }
                        prop_assert_eq!(o.remaining, n - live.len() as i64);
                        next_id += 1;
                    }
                    Op::Release(i) if !granted.is_empty() => {
                        let lease = granted[i % granted.len()];
                        let was_live = live.iter().any(|&(l, _)| l == lease);
                        prop_assert_eq!(release(&p, &mut slots, now, lease), was_live);
                        live.retain(|&(l, _)| l != lease);
                    }
                    Op::Release(_) => {}
                    Op::Wait(dt) => now += dt,
                }
                let held = slots.iter().filter(|s| p.slot_held(**s, now)).count();
                live.retain(|&(_, at)| now < at);
                prop_assert_eq!(held, live.len());
                prop_assert!(held as i64 <= n);
            }
        }
    }
}
