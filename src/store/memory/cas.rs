//! The lock-free path: a bucket's level and instant are one 128-bit word ([`AtomicState`]), so taking tokens
//! from one existing bucket whose numbers are those of the call needs only its partition's SHARED lock and
//! a compare-and-swap loop ([`swap_take`]). Callers of a partition never wait for each other, so a backend
//! preempted in the middle of a call stalls nobody, and two calls on one bucket serialise on the word (a
//! failed swap re-reads and re-evaluates: exact). Where the CPU has no lock-free 128-bit compare-and-swap,
//! the caller takes the exclusive path instead.

use super::atomic_state::AtomicState;
use super::guards::SharedGuard;
use super::segment::Table;
use super::slots::{slot_policy, Probe};
use rate_limit_model::algorithm::{Outcome, Policy, State};
use rate_limit_model::target::{Ask, Stored, Target};

/// Answers `ask` for one existing bucket under its partition's SHARED lock, by compare-and-swap
/// ([`swap_take`]). `None` when the bucket must be written under the exclusive lock: it does not exist
/// yet (insert), or it was written under other numbers (they are converted and rewritten with the state).
/// The store's clock is read by `clock` (a call's `Table::now`; a run reads it once for several keys).
pub(super) fn take_shared_at(
    table: &Table,
    target: &Target<'_>,
    hash: &[u64; 2],
    partition: u32,
    ask: Ask,
    clock: impl Fn() -> i64,
) -> Option<Outcome> {
    take_under(&table.lock_shared(partition), target, hash, ask, clock)
}

/// [`take_shared_at`] in a partition the caller has locked SHARED (`part`): a run takes several keys of
/// one partition under one lock.
pub(super) fn take_under(
    part: &SharedGuard<'_>,
    target: &Target<'_>,
    hash: &[u64; 2],
    ask: Ask,
    clock: impl Fn() -> i64,
) -> Option<Outcome> {
    let Probe::Found(idx) = part.probe(hash) else {
        return None;
    };
    let slot = &part.slots[idx];
    let stored = slot_policy(slot).filter(|p| *p == target.policy)?;
    Some(swap_take(&slot.state, stored, target, ask, clock).outcome)
}

/// What [`swap_take`] decided: the outcome, the state it was decided on (the one replaced on a grant) and
/// the instant it was evaluated at.
struct Swap {
    outcome: Outcome,
    #[cfg_attr(not(test), allow(dead_code))]
    replaced: State,
    #[cfg_attr(not(test), allow(dead_code))]
    now: i64,
}

/// Answers `ask` (takes or charges tokens) for the bucket whose state is `state` (written under the numbers
/// `stored`, those of `target`): evaluates the state it loads at `clock()` and swaps in the result if the state is still the
/// one evaluated, else starts again from the newer state. A denial writes nothing. Each grant is thus
/// decided on the state it replaces, exactly as if the calls had run one after another in the order of
/// their swaps; an instant never moves back (a call that read the clock just before another one's swap
/// evaluates at the stored instant, as no time elapsed).
/// Says which state the decision replaced and the instant used (the model tests check both).
fn swap_take(
    state: &AtomicState,
    stored: Policy,
    target: &Target<'_>,
    ask: Ask,
    clock: impl Fn() -> i64,
) -> Swap {
    loop {
        let current = state.load();
        let now = clock().max(current.at);
        let outcome = target.answer(
            Some(Stored {
                state: current,
                policy: stored,
            }),
            now,
            ask,
        );
        if !outcome.allowed || state.swap_if(current, outcome.state) {
            return Swap {
                outcome,
                replaced: current,
                now,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rate_limit_model::algorithm::Algorithm;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use std::sync::Mutex;

    const S: i64 = 1_000_000;

    fn target(policy: Policy) -> Target<'static> {
        Target {
            namespace: rate_limit_model::target::Namespace::AdHoc,
            key: "k",
            policy,
            changed_at: i64::MIN,
            shadow: false,
            blocking: None,
            verdict: None,
        }
    }

    /// Eight threads race for the 1 000 tokens of one bucket at a fixed instant: exactly 1 000 are granted
    /// and the word ends where 1 000 serial takes end.
    #[test]
    fn swaps_grant_exactly_the_tokens_there_are() {
        assert!(
            AtomicState::swaps_are_lock_free(),
            "this CPU has no lock-free 128-bit CAS"
        );
        let policy = Policy::new(Algorithm::TokenBucket, 1, 3600 * S, 1000).unwrap();
        let state = AtomicState::new(policy.full(0));
        let t = target(policy);
        let granted = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..500 {
                        if swap_take(&state, policy, &t, Ask::Take(1), || 0)
                            .outcome
                            .allowed
                        {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(granted.load(Ordering::Relaxed), 1000);
        let mut serial = policy.full(0);
        for _ in 0..1000 {
            serial = policy.take(serial, 0, 1).state;
        }
        assert_eq!(state.load(), serial);
        assert!(!policy.take(serial, 0, 1).allowed);
    }

    /// With a clock that moves on at every reading, the grants of eight threads form one chain of swaps from
    /// the initial state: no two grants replaced the same state (no lost update), every grant is in the
    /// chain, and every link is exactly the model's step from the state it replaced at the instant it used.
    #[test]
    fn swaps_form_one_chain_of_exact_steps() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            let policy = Policy::new(algorithm, 5, 1000, 5).unwrap();
            let initial = policy.full(0);
            let state = AtomicState::new(initial);
            let t = target(policy);
            let clock = AtomicI64::new(0);
            let grants: Mutex<Vec<Swap>> = Mutex::new(Vec::new());
            std::thread::scope(|scope| {
                for _ in 0..8 {
                    scope.spawn(|| {
                        for _ in 0..2000 {
                            let swap = swap_take(&state, policy, &t, Ask::Take(1), || {
                                clock.fetch_add(1, Ordering::Relaxed)
                            });
                            if swap.outcome.allowed {
                                grants.lock().unwrap().push(swap);
                            }
                        }
                    });
                }
            });
            let grants = grants.into_inner().unwrap();
            let by_replaced: HashMap<State, &Swap> =
                grants.iter().map(|g| (g.replaced, g)).collect();
            assert_eq!(
                by_replaced.len(),
                grants.len(),
                "{algorithm:?}: two grants replaced one state"
            );
            let mut current = initial;
            let mut links = 0;
            while let Some(g) = by_replaced.get(&current) {
                assert!(g.now >= current.at, "{algorithm:?}: an instant moved back");
                let step = policy.take(current, g.now, 1);
                assert!(step.allowed);
                assert_eq!(
                    step.state, g.outcome.state,
                    "{algorithm:?}: not the model's step"
                );
                current = g.outcome.state;
                links += 1;
            }
            assert_eq!(
                current,
                state.load(),
                "{algorithm:?}: the chain does not end at the word"
            );
            assert_eq!(
                links,
                grants.len(),
                "{algorithm:?}: grants outside the chain"
            );
            assert!(
                links > 5,
                "{algorithm:?}: refill should grant more than the burst"
            );
        }
    }
}
