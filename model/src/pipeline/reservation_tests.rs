//! Reservations through the pipeline ([`single::reserve`], [`single::settle`]) against the in-memory
//! store of the take tests, with plain `cargo test`: generated sequences of reserves, settles (of held,
//! settled, expired and made-up reservations, with actual use below, at and above the estimate) and waits,
//! checked call by call against a reference that counts every token: what a key's bucket lost is exactly
//! the estimates of its unsettled reservations (held or expired) plus the actual use of its settled ones,
//! a reserve is granted exactly when that leaves `estimate` tokens, a settle settles exactly a held
//! reservation, once, and its preview (what the memory store answers before its commit applies it) is
//! exactly what it does.

use proptest::prelude::*;

use super::*;
use crate::algorithm::{reservation_namespace, Algorithm, Policy};
use crate::target::{granted, Namespace};
use tests::TestStore;

const S: i64 = 1_000_000;
const BURST: i64 = 100;

/// The key's bucket: `BURST` tokens, refilling one token per 10^12 µs (never within a test).
fn key_target() -> Target<'static> {
    Target {
        namespace: Namespace::Policy {
            name: "llm",
            created_at: 0,
        },
        key: "tenant",
        policy: Policy::new(Algorithm::TokenBucket, 1, 1_000_000 * S, BURST).expect("valid"),
        changed_at: i64::MIN,
        shadow: false,
        blocking: None,
        verdict: None,
    }
}

/// The bucket of reservation `name` (its namespace) held for `hold` µs.
fn reservation_target(name: &str, hold: i64) -> Target<'_> {
    Target {
        namespace: Namespace::Policy {
            name,
            created_at: 0,
        },
        policy: Policy::reservation(hold).expect("valid"),
        ..key_target()
    }
}

#[derive(Clone, Debug)]
enum Step {
    Wait(i64),
    Reserve {
        estimate: i64,
        hold: i64,
    },
    /// A settle of the `pick`th reservation ever made (or of one never made, past the end).
    Settle {
        pick: usize,
        actual: i64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0..2 * S).prop_map(Step::Wait),
        3 => (1..40i64, 1..4 * S).prop_map(|(estimate, hold)| Step::Reserve { estimate, hold }),
        3 => (0..12usize, 0..60i64).prop_map(|(pick, actual)| Step::Settle { pick, actual }),
    ]
}

/// A reservation the reference knows: its id, estimate and expiry, and its actual use once settled.
struct Made {
    id: i64,
    estimate: i64,
    expiry: i64,
    settled: Option<i64>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Every token is accounted for, every reserve and settle answers as the reference does.
    #[test]
    fn every_token_of_a_reservation_is_accounted_for(steps in prop::collection::vec(step(), 1..40)) {
        let store = TestStore { now: std::cell::Cell::new(10 * S), ..TestStore::default() };
        let key = key_target();
        let mut made: Vec<Made> = Vec::new();
        for (n, step) in steps.iter().enumerate() {
            let now = store.now.get();
            let consumed: i64 = made.iter().map(|m| m.settled.unwrap_or(m.estimate)).sum();
            match *step {
                Step::Wait(us) => store.now.set(now + us),
                Step::Reserve { estimate, hold } => {
                    let id = i64::try_from(n).expect("small") + 1;
                    let name = reservation_namespace("llm", id);
                    let r = reservation_target(&name, hold);
                    let (answer, recorded) =
                        single::reserve(&store, |_, _, _| Ok(None), &key, &r, estimate)
                            .map_err(|()| TestCaseError::fail("store error"))?;
                    let fits = BURST - consumed >= estimate;
                    prop_assert_eq!(answer.outcome.allowed, fits);
                    prop_assert_eq!(recorded, fits);
                    if fits {
                        made.push(Made { id, estimate, expiry: now + hold, settled: None });
                    }
                }
                Step::Settle { pick, actual } => {
                    let (id, hold) = made.get(pick).map_or((-7, S), |m| (m.id, 1));
                    let name = reservation_namespace("llm", id);
                    // settle does not know the hold: it reads the reservation under other numbers
                    let r = reservation_target(&name, hold);
                    let (preview, will_settle) =
                        single::settle_preview(&store, &key, &r, actual, 10_000, false)
                            .map_err(|()| TestCaseError::fail("store error"))?;
                    let (answer, settled) = single::settle(&store, &key, &r, actual, 10_000)
                        .map_err(|()| TestCaseError::fail("store error"))?;
                    // what a store that settles at commit answers is what the settle then does
                    prop_assert_eq!(preview.outcome, answer.outcome);
                    prop_assert_eq!(will_settle, settled);
                    let held = made.get_mut(pick).filter(|m| m.settled.is_none() && now < m.expiry);
                    prop_assert_eq!(settled, held.is_some());
                    if let Some(m) = held {
                        m.settled = Some(actual);
                    }
                    prop_assert!(answer.outcome.allowed || answer.outcome.remaining == 0);
                }
            }
            let now = store.now.get();
            let consumed: i64 = made.iter().map(|m| m.settled.unwrap_or(m.estimate)).sum();
            let state = key.current(store.stored(&key), now);
            let (num, den) = key.policy.tokens_exact(state, now);
            prop_assert_eq!(num.div_euclid(den), i128::from(BURST - consumed), "after {:?}", step);
        }
    }
}

/// A settle twice, a settle after the hold, and one of a reservation made for a key exempt by its override.
#[test]
fn settles_change_nothing_after_the_first_or_the_hold_and_take_nothing_that_was_not_taken() {
    let store = TestStore {
        now: std::cell::Cell::new(10 * S),
        ..TestStore::default()
    };
    let key = key_target();
    let name = reservation_namespace("llm", 1);
    let r = reservation_target(&name, S);
    let (a, recorded) = single::reserve(&store, |_, _, _| Ok(None), &key, &r, 30).expect("store");
    assert!(a.outcome.allowed && recorded);
    assert_eq!(a.outcome.remaining, 70);
    let (a, settled) = single::settle(&store, &key, &r, 10, 0).expect("store");
    assert!(settled);
    assert_eq!(a.outcome.remaining, 90);
    let (a, settled) = single::settle(&store, &key, &r, 0, 0).expect("store");
    assert!(!settled);
    assert_eq!(a.outcome.remaining, 90);
    // unsettled until its hold ends: settled at its estimate
    let name = reservation_namespace("llm", 2);
    let r = reservation_target(&name, S);
    single::reserve(&store, |_, _, _| Ok(None), &key, &r, 50).expect("store");
    store.now.set(11 * S);
    let (a, settled) = single::settle(&store, &key, &r, 0, 0).expect("store");
    assert!(!settled);
    assert_eq!(a.outcome.remaining, 40);
    // an exempt key takes nothing, so its reservation records nothing to give back
    let exempt = Target {
        verdict: Some(crate::target::Verdict::Exempt),
        ..key
    };
    let name = reservation_namespace("llm", 3);
    let r = reservation_target(&name, S);
    let (a, recorded) =
        single::reserve(&store, |_, _, _| Ok(None), &exempt, &r, 20).expect("store");
    assert!(a.outcome.allowed && !recorded);
    let (_, settled) = single::settle(&store, &key, &r, 0, 0).expect("store");
    assert!(!settled);
    assert_eq!(
        key.evaluate(store.stored(&key), 11 * S, 0).remaining,
        40,
        "nothing given back"
    );
}

/// A reservation over two policies of one key takes each its own estimate, all or nothing, records one
/// bucket per policy under one id, and each is settled once on what its policy counted.
#[test]
fn a_reservation_over_two_policies_takes_each_its_estimate_all_or_nothing() {
    let store = TestStore {
        now: std::cell::Cell::new(10 * S),
        ..TestStore::default()
    };
    let tokens = key_target();
    let requests = Target {
        namespace: Namespace::Policy {
            name: "rpm",
            created_at: 0,
        },
        policy: Policy::new(Algorithm::TokenBucket, 1, 1_000_000 * S, 3).expect("valid"),
        ..key_target()
    };
    let keys = [requests, tokens];
    let reserve = |id: i64, estimates: [i64; 2]| {
        let names = [
            reservation_namespace("rpm", id),
            reservation_namespace("llm", id),
        ];
        let held = [
            reservation_target(&names[0], S),
            reservation_target(&names[1], S),
        ];
        let (answers, recorded) =
            single::reserve_many(&store, |_, _, _| Ok(None), &keys, &held, &estimates)
                .expect("store");
        let remaining: Vec<i64> = answers.iter().map(|a| a.outcome.remaining).collect();
        (granted(&keys, &outcomes(&answers)), recorded, remaining)
    };
    assert_eq!(reserve(1, [1, 60]), (true, true, vec![2, 40]));
    // the tokens' bucket is short: nothing is taken from the requests' either
    assert!(!reserve(2, [1, 41]).0, "the tokens' bucket holds 40");
    assert_eq!(reserve(3, [1, 40]), (true, true, vec![1, 0]));
    assert_eq!(
        keys.map(|k| k.evaluate(store.stored(&k), 10 * S, 0).remaining),
        [1, 0]
    );
    // id 1 settled per policy on what each counted: 1 request, 25 tokens; once
    let settle = |name: &str, key: &Target<'_>, actual: i64| {
        let r = reservation_target(name, S);
        single::settle(&store, key, &r, actual, 0).expect("store")
    };
    let (a, settled) = settle(&reservation_namespace("rpm", 1), &requests, 1);
    assert!(settled && a.outcome.remaining == 1);
    let (a, settled) = settle(&reservation_namespace("llm", 1), &tokens, 25);
    assert!(settled && a.outcome.remaining == 35);
    let (a, settled) = settle(&reservation_namespace("llm", 1), &tokens, 0);
    assert!(!settled && a.outcome.remaining == 35);
    // a denied reservation recorded nothing to settle
    let (_, settled) = settle(&reservation_namespace("llm", 2), &tokens, 0);
    assert!(!settled);
    // id 3 settled under both policies in one call (1 request back; 10 of 40 tokens used: 35 + 30), once
    let names = [
        reservation_namespace("rpm", 3),
        reservation_namespace("llm", 3),
    ];
    let held = [
        reservation_target(&names[0], S),
        reservation_target(&names[1], S),
    ];
    let settle_both = || {
        single::settle_many(&store, &keys, &held, &[0, 10], &[0, 0])
            .expect("store")
            .iter()
            .map(|(a, settled)| (a.outcome.remaining, *settled))
            .collect::<Vec<_>>()
    };
    assert_eq!(settle_both(), [(2, true), (65, true)]);
    assert_eq!(settle_both(), [(2, false), (65, false)]);
}
