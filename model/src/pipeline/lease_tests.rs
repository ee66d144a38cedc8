//! Leases through the pipeline ([`single::acquire`], [`single::release`]) against the in-memory store of
//! the take tests, with plain `cargo test`: generated sequences of acquires (some in shadow mode),
//! releases of held, released and made-up leases, blocks by hand and waits, over a concurrency policy with
//! or without a penalty box, checked call by call against a reference that counts the leases each key
//! holds: never more than the policy allows, each granted lease new and in one of the key's slots, a
//! blocked key given none, a release true exactly for a lease still held, and every call's locks in order.

use proptest::prelude::*;

use super::tests::{check_lock_order, TestStore};
use super::*;
use crate::algorithm::{block_namespace, lease_id, slot_of, Algorithm, Policy};
use crate::target::{Ask, Blocking, Namespace};

const S: i64 = 1_000_000;
const KEYS: [&str; 2] = ["k1", "k2"];

/// A concurrency policy of a generated world.
#[derive(Clone, Debug)]
struct Leases {
    policy: Policy,
    /// (block_after, block_for µs)
    penalty: Option<(i64, i64)>,
}

impl Leases {
    fn target<'a>(&self, key: &'a str, shadow: bool) -> Target<'a> {
        Target {
            namespace: Namespace::Policy {
                name: "jobs",
                created_at: 0,
            },
            key,
            policy: self.policy,
            changed_at: i64::MIN,
            shadow,
            blocking: Some(Blocking {
                bucket: Policy::block_bucket(self.penalty.map(|p| p.0), S).expect("valid"),
                penalty_for: self.penalty.map(|p| p.1),
                blocks_by_hand: true,
            }),
            verdict: None,
        }
    }
}

fn leases() -> impl Strategy<Value = Leases> {
    (
        1..4i64,
        1..3 * S,
        prop::option::weighted(0.5, (1..3i64, 1..2 * S)),
    )
        .prop_map(|(rate, period, penalty)| Leases {
            policy: Policy::new(Algorithm::Concurrency, rate, period, rate).expect("valid"),
            penalty,
        })
}

/// One step of a generated sequence.
#[derive(Clone, Debug)]
enum Step {
    /// The clock moves on by this many µs.
    Wait(i64),
    /// An acquire of the key, perhaps in shadow mode.
    Acquire { key: usize, shadow: bool },
    /// A release of the key's `pick`th held lease, or when it holds fewer, of a lease it no longer holds
    /// (or never had).
    Release { key: usize, pick: usize },
    /// A block of the key by hand for this many µs.
    Block { key: usize, duration: i64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0..S).prop_map(Step::Wait),
        5 => (0..KEYS.len(), prop::bool::weighted(0.15))
            .prop_map(|(key, shadow)| Step::Acquire { key, shadow }),
        3 => (0..KEYS.len(), 0..5usize).prop_map(|(key, pick)| Step::Release { key, pick }),
        1 => (0..KEYS.len(), 1..S).prop_map(|(key, duration)| Step::Block { key, duration }),
    ]
}

/// Whether the key of `t` is blocked now, read from its block bucket as the docs define it.
fn blocked(store: &TestStore, t: &Target<'_>) -> bool {
    let b = t.blocking.expect("a policy's key");
    let name = block_namespace(t.namespace.stored_name());
    let bucket = Target {
        namespace: Namespace::Policy {
            name: &name,
            created_at: 0,
        },
        policy: b.bucket,
        shadow: false,
        blocking: None,
        ..*t
    };
    !bucket
        .evaluate(store.stored(&bucket), store.now.get(), 0)
        .allowed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Every acquire and release answers as the reference counts leases; no key ever holds more leases
    /// than its policy allows; every call locks in order.
    #[test]
    fn leases_are_counted_exactly(world in leases(), steps in prop::collection::vec(step(), 1..50)) {
        let store = TestStore { now: std::cell::Cell::new(10 * S), ..TestStore::default() };
        let rate = world.policy.rate();
        // per key: the leases it holds (id, expiry); every id ever granted
        let mut held: [Vec<(i64, i64)>; 2] = [Vec::new(), Vec::new()];
        let mut granted_ids: Vec<i64> = Vec::new();
        for (n, step) in steps.iter().enumerate() {
            let now = store.now.get();
            for h in held.iter_mut() {
                h.retain(|&(_, expiry)| now < expiry);
            }
            store.locks.borrow_mut().clear();
            match *step {
                Step::Wait(us) => store.now.set(now + us),
                Step::Acquire { key, shadow } => {
                    let t = world.target(KEYS[key], shadow);
                    let was_blocked = !shadow && blocked(&store, &t);
                    let random = u64::try_from(n + 1).expect("small") << 12;
                    let (answer, lease) = single::acquire(&store, &t, random, None)
                        .map_err(|_| TestCaseError::fail("store error"))?;
                    check_lock_order(&store.locks.borrow())?;
                    let free = i64::try_from(held[key].len()).expect("small") < rate;
                    if was_blocked {
                        prop_assert!(!answer.outcome.allowed && answer.by_block && lease.is_none());
                    } else {
                        prop_assert_eq!(answer.outcome.allowed, free, "{:?}", answer);
                        prop_assert_eq!(lease.is_some(), free);
                    }
                    if let Some(id) = lease {
                        prop_assert!(!granted_ids.contains(&id), "lease {} granted twice", id);
                        prop_assert!(slot_of(id) < rate);
                        prop_assert_eq!(id, lease_id(random, slot_of(id)));
                        granted_ids.push(id);
                        held[key].push((id, now + world.policy.period_us()));
                    }
                    let left = rate - i64::try_from(held[key].len()).expect("small");
                    if !was_blocked {
                        prop_assert_eq!(answer.outcome.remaining, left);
                    }
                }
                Step::Release { key, pick } => {
                    let t = world.target(KEYS[key], false);
                    let lease = match held[key].get(pick) {
                        Some(&(id, _)) => id,
                        // one it held once (released or expired), or one no acquire made
                        None => granted_ids.get(pick).copied().unwrap_or(lease_id(u64::MAX, 0)),
                    };
                    let expected = held[key].iter().any(|&(id, _)| id == lease);
                    let released = single::release(&store, &t, lease, None)
                        .map_err(|_| TestCaseError::fail("store error"))?;
                    check_lock_order(&store.locks.borrow())?;
                    prop_assert_eq!(released, expected, "release of {}", lease);
                    held[key].retain(|&(id, _)| id != lease);
                }
                Step::Block { key, duration } => {
                    let t = world.target(KEYS[key], false);
                    let (name, blocking) = blocks::block_of(&t).expect("a policy's key");
                    store.answer(&blocks::block_target(&t, &name, &blocking), Ask::Block { duration });
                }
            }
            // the store's slots hold exactly the reference's leases
            let now = store.now.get();
            for (key, h) in KEYS.iter().zip(&held) {
                let t = world.target(key, false);
                let names = single::slot_names(&t);
                let in_store = single::slot_targets(&t, &names)
                    .iter()
                    .filter(|s| store.stored(s).is_some_and(|b| world.policy.slot_held(b.state, now)))
                    .count();
                let live = h.iter().filter(|&&(_, expiry)| now < expiry).count();
                prop_assert_eq!(in_store, live, "{}", key);
                prop_assert!(i64::try_from(in_store).expect("small") <= rate);
            }
        }
    }
}

/// An adaptive concurrency policy through the pipeline: an acquire tries only the slots below the key's
/// limit; a release's report cuts the limit (written after the slot, in the lock order) or, at its most,
/// writes nothing; a lease held above a lowered limit is kept and can still be released.
#[test]
fn an_adaptive_limit_bounds_the_slots_an_acquire_tries() {
    use crate::algorithm::adaptive::UNITS;
    use crate::algorithm::{limit_namespace, Adaptive, Report};
    use single::{CallReport, KeyLimit};
    let store = TestStore {
        now: std::cell::Cell::new(10 * S),
        ..TestStore::default()
    };
    let world = Leases {
        policy: Policy::new(Algorithm::Concurrency, 5, 30 * S, 5).expect("valid"),
        penalty: None,
    };
    let t = world.target("k1", false);
    let name = limit_namespace("jobs");
    let limit = KeyLimit {
        bucket: Target {
            namespace: Namespace::Policy {
                name: &name,
                created_at: 0,
            },
            policy: Policy::adaptive_limit(5, 30 * S).expect("numbers"),
            blocking: None,
            ..t
        },
        settings: Adaptive::new(2, 5, S / 10).expect("settings"),
    };
    let acquire = |random| single::acquire(&store, &t, random, Some(&limit)).expect("acquire");
    let mut leases: Vec<i64> = (0..5)
        .map(|n| acquire(n << 12).1.expect("a lease below the limit of 5"))
        .collect();
    assert!(acquire(99 << 12).1.is_none(), "five held");
    // a good call at the most writes no limit
    let good = CallReport {
        limit,
        report: Report::Ok,
        latency_us: Some(S / 20),
    };
    let first = leases.remove(0);
    assert!(single::release(&store, &t, first, Some(&good)).expect("release"));
    assert!(store.stored(&limit.bucket).is_none());
    // a dropped call cuts it to 4 (90% of 5 = 4.5 leases): slots 0..4 only
    let dropped = CallReport {
        report: Report::Dropped,
        ..good
    };
    let second = leases.remove(0);
    store.locks.borrow_mut().clear();
    assert!(single::release(&store, &t, second, Some(&dropped)).expect("release"));
    assert!(
        check_lock_order(&store.locks.borrow()).is_ok(),
        "locks in order"
    );
    assert_eq!(
        store.stored(&limit.bucket).map(|s| s.state.level),
        Some(4 * UNITS + UNITS / 2)
    );
    // slots 0 and 1 are free, 2..4 held: acquires try slots 0..3 only (the limit is 4)
    let (answer, lease) = acquire(7 << 12);
    assert_eq!(lease.map(slot_of), Some(0));
    assert_eq!(answer.outcome.remaining, 1, "slot 1 free of 0..3");
    let (answer, lease) = acquire(8 << 12);
    assert_eq!(lease.map(slot_of), Some(1));
    assert_eq!(answer.outcome.remaining, 0);
    // slot 4's lease, acquired under the older limit, is kept (five held for now) but not replaced
    assert!(
        acquire(9 << 12).1.is_none(),
        "four held below the limit of 4"
    );
    let above = leases[2];
    assert_eq!(slot_of(above), 4);
    assert!(single::release(&store, &t, above, Some(&good)).expect("release"));
    assert!(acquire(10 << 12).1.is_none(), "slot 4 is not tried again");
}
