//! Booked slots through the pipeline ([`single::book`], [`single::cancel`]) against
//! the in-memory store of the take tests, with plain `cargo test`: the times a queue of bookings gets, a
//! cancel before and after a booking's time, overrides and blocks, and generated sequences of bookings,
//! cancels, takes and waits checked against the rate: over any stretch of time, the tokens used in it
//! (a take's at its call, a booking's at its time, a cancelled booking's never; each at most the burst)
//! are at most the burst plus what the rate refills in it.

use proptest::prelude::*;

use super::*;
use crate::algorithm::{booking_namespace, Algorithm, Policy};
use crate::target::{Namespace, Verdict};
use tests::TestStore;

const S: i64 = 1_000_000;

/// The key's bucket: 2 tokens a second, burst `burst`.
fn key_target(burst: i64) -> Target<'static> {
    Target {
        namespace: Namespace::Policy {
            name: "calls",
            created_at: 0,
        },
        key: "tenant",
        policy: Policy::new(Algorithm::TokenBucket, 2, S, burst).expect("valid"),
        changed_at: i64::MIN,
        shadow: false,
        blocking: None,
        verdict: None,
    }
}

/// The bucket of booking `name` (its namespace); `book` sets its hold.
fn booking_target(name: &str) -> Target<'_> {
    Target {
        namespace: Namespace::Policy {
            name,
            created_at: 0,
        },
        policy: Policy::reservation(1).expect("valid"),
        ..key_target(1)
    }
}

fn store_at(now: i64) -> TestStore {
    TestStore {
        now: std::cell::Cell::new(now),
        ..TestStore::default()
    }
}

#[test]
fn a_queue_of_bookings_gets_the_rates_slots_and_a_cancel_gives_one_back() {
    let store = store_at(10 * S);
    let key = key_target(1);
    let names: Vec<String> = (1..=6).map(|id| booking_namespace("calls", id)).collect();
    let mut booked = Vec::new();
    for name in &names {
        let b = single::book(&store, &key, &booking_target(name), 1, 10, 60 * S).expect("store");
        assert!(b.answer.outcome.allowed);
        assert_eq!(b.answer.memo, Memo::Forget);
        booked.push((b.wait, b.recorded));
    }
    // the burst now (nothing to cancel), then one every half second
    assert_eq!(
        booked,
        [
            (0, false),
            (S / 2, true),
            (S, true),
            (3 * S / 2, true),
            (2 * S, true),
            (5 * S / 2, true)
        ]
    );
    // cancelling the last gives its token back, once: the next booking gets its time
    let (a, cancelled) = single::cancel(&store, &key, &booking_target(&names[5])).expect("store");
    assert!(cancelled);
    assert_eq!(key.policy.booked_wait(a.outcome.state), 2 * S);
    let (_, again) = single::cancel(&store, &key, &booking_target(&names[5])).expect("store");
    assert!(!again);
    let next = booking_namespace("calls", 7);
    let b = single::book(&store, &key, &booking_target(&next), 1, 10, 60 * S).expect("store");
    assert_eq!((b.wait, b.recorded), (5 * S / 2, true));
    // cancelling one in the middle frees it, but its token stays booked: later bookings wait behind it,
    // and giving it back would let the next booking share a slot with one of theirs
    let (a, cancelled) = single::cancel(&store, &key, &booking_target(&names[2])).expect("store");
    assert!(cancelled);
    assert_eq!(key.policy.booked_wait(a.outcome.state), 5 * S / 2);
    let next = booking_namespace("calls", 9);
    let b = single::book(&store, &key, &booking_target(&next), 1, 10, 60 * S).expect("store");
    assert_eq!((b.wait, b.recorded), (3 * S, true));
    // once its time has come, a booking has been used: it cannot be cancelled
    store.now.set(10 * S + S / 2);
    let (_, late) = single::cancel(&store, &key, &booking_target(&names[1])).expect("store");
    assert!(!late);
    // a caller that waits less than the queue is denied, told when a booking would fit its delay
    let short = booking_namespace("calls", 8);
    let b = single::book(&store, &key, &booking_target(&short), 1, 10, S).expect("store");
    assert!(!b.answer.outcome.allowed);
    assert_eq!((b.wait, b.recorded), (0, false));
    // the queue ends 2.5 s after this half second: the next slot, 3 s away, fits a 1 s delay in 2 s
    assert_eq!(b.answer.outcome.retry_after, Some(2 * S));
}

#[test]
fn overrides_and_blocks_decide_before_the_bucket_is_booked() {
    let store = store_at(10 * S);
    let name = booking_namespace("calls", 1);
    let exempt = Target {
        verdict: Some(Verdict::Exempt),
        ..key_target(1)
    };
    let b = single::book(&store, &exempt, &booking_target(&name), 5, 10, 60 * S).expect("store");
    assert!(b.answer.outcome.allowed);
    assert_eq!((b.wait, b.recorded), (0, false));
    assert_eq!(
        store.stored(&exempt),
        None,
        "an exempt key's bucket is not touched"
    );
    let denied = Target {
        verdict: Some(Verdict::Deny {
            until: Some(20 * S),
        }),
        ..key_target(1)
    };
    let b = single::book(&store, &denied, &booking_target(&name), 1, 10, 60 * S).expect("store");
    assert!(!b.answer.outcome.allowed);
    assert_eq!((b.wait, b.recorded), (0, false));
    assert_eq!(store.stored(&denied), None);
    // a policy without debt books only what its bucket holds
    let key = key_target(1);
    let b = single::book(&store, &key, &booking_target(&name), 1, 0, 60 * S).expect("store");
    assert!(b.answer.outcome.allowed && b.wait == 0);
    let b = single::book(&store, &key, &booking_target(&name), 1, 0, 60 * S).expect("store");
    assert!(!b.answer.outcome.allowed);
    assert_eq!(b.answer.outcome.retry_after, Some(S / 2));
}

#[derive(Clone, Debug)]
enum Step {
    Wait(i64),
    Book {
        cost: i64,
        max_delay: i64,
    },
    Take(i64),
    /// A cancel of the `pick`th booking ever made.
    Cancel(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0..2 * S).prop_map(Step::Wait),
        4 => (1..4i64, 0..8 * S).prop_map(|(cost, max_delay)| Step::Book { cost, max_delay }),
        1 => (1..3i64).prop_map(Step::Take),
        1 => (0..12usize).prop_map(Step::Cancel),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Bookings, cancels and takes never use more than the rate allows over any stretch of time; a
    /// booking waits at most its caller's delay, is recorded exactly when it is for later, and a cancel
    /// succeeds exactly once, before its booking's time.
    #[test]
    fn bookings_honour_the_rate(burst in 1i64..4, steps in prop::collection::vec(step(), 1..40)) {
        let store = store_at(10 * S);
        let key = key_target(burst);
        // (time of use, tokens, the booking's name and whether it stands) per grant
        let mut used: Vec<(i64, i64, Option<String>, bool)> = Vec::new();
        for (n, step) in steps.iter().enumerate() {
            let now = store.now.get();
            match step {
                Step::Wait(us) => store.now.set(now + us),
                Step::Book { cost, max_delay } => {
                    // within the burst: a booking of more is made of tokens that accumulate before its
                    // time, which a bound over stretches of time would count against the wrong stretch
                    let cost = &(*cost).min(burst);
                    let id = i64::try_from(n).expect("small") + 1;
                    let name = booking_namespace("calls", id);
                    let b = single::book(&store, &key, &booking_target(&name), *cost, 20, *max_delay)
                        .map_err(|()| TestCaseError::fail("store error"))?;
                    if b.answer.outcome.allowed {
                        prop_assert!(b.wait <= *max_delay);
                        prop_assert_eq!(b.recorded, b.wait > 0);
                        used.push((now + b.wait, *cost, Some(name), true));
                    } else {
                        prop_assert!(b.answer.outcome.retry_after.is_none_or(|r| r > 0));
                        prop_assert!(!b.recorded);
                    }
                }
                Step::Take(cost) => {
                    let a = take(&store, |_, _, _| Ok(None), std::slice::from_ref(&key), *cost)
                        .map_err(|()| TestCaseError::fail("store error"))?[0];
                    if a.outcome.allowed {
                        used.push((now, *cost, None, true));
                    }
                }
                Step::Cancel(pick) => {
                    let Some((time, _, Some(name), stands)) = used.iter_mut().filter(|u| u.2.is_some()).nth(*pick) else {
                        continue;
                    };
                    let (_, cancelled) = single::cancel(&store, &key, &booking_target(name))
                        .map_err(|()| TestCaseError::fail("store error"))?;
                    prop_assert_eq!(cancelled, *stands && now < *time);
                    if cancelled {
                        // its tokens are used at its time unless given back (nothing booked after it)
                        *stands = false;
                    }
                }
            }
        }
        let standing: Vec<(i64, i64)> = used.iter().filter(|u| u.3).map(|u| (u.0, u.1)).collect();
        for &(a, _) in &standing {
            for &(b, _) in &standing {
                if b < a {
                    continue;
                }
                let in_window: i64 = standing.iter().filter(|u| a <= u.0 && u.0 <= b).map(|u| u.1).sum();
                // burst + 2 tokens a second over [a, b]
                let allowed = i128::from(burst) + (i128::from(b - a) * 2) / i128::from(S);
                prop_assert!(i128::from(in_window) <= allowed, "{} tokens used in [{}, {}]", in_window, a, b);
            }
        }
    }
}
