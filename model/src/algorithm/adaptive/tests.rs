//! The adaptive limit against a simulated backend: many clients call through one key's leases a backend
//! whose latency rises above the target once more than `C` calls run at once; the limit must settle near
//! `C`, never let more calls run than it allows, and back off within one round when the backend starts
//! dropping calls.

use super::*;
use crate::test_support::Lcg;
use proptest::prelude::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const MS: i64 = 1000;
/// The latency target of every simulation.
const TARGET: i64 = 100 * MS;

/// What a client does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// Try to acquire a lease.
    Acquire,
    /// Its call ends: the lease was acquired at `acquired_at`, the call took `latency` µs.
    Release { acquired_at: i64, latency: i64 },
}

/// One run: its limit over time and what it checked on the way.
struct Run {
    /// (instant, limit) at every change of the limit, in order.
    limits: Vec<(i64, i64)>,
    /// The most calls that ran at once.
    most_running: i64,
}

impl Run {
    /// The limit at `t`.
    fn limit_at(&self, t: i64) -> i64 {
        self.limits
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map_or(0, |(_, l)| *l)
    }

    /// The time-weighted mean of the limit over `[from, to)`.
    fn mean(&self, from: i64, to: i64) -> f64 {
        let mut sum = 0i128;
        let mut last = (from, self.limit_at(from));
        for &(at, limit) in self.limits.iter().filter(|(at, _)| *at > from && *at < to) {
            sum += i128::from(at - last.0) * i128::from(last.1);
            last = (at, limit);
        }
        sum += i128::from(to - last.0) * i128::from(last.1);
        sum as f64 / (to - from) as f64
    }

    /// The first instant at or after `from` when the limit was below `limit`.
    fn first_below(&self, from: i64, limit: i64) -> Option<i64> {
        self.limits
            .iter()
            .find(|(at, l)| *at >= from && *l < limit)
            .map(|(at, _)| *at)
    }
}

/// `clients` clients calling without pause through the leases of one key with settings `a` for
/// `duration` µs; the backend serves a call in about half the target while at most `knee` calls run (the
/// one just admitted counted), in about twice the target above that, and from `drop_from` on it drops
/// every call it ends. Leases are granted while fewer than the limit are held, as a store grants them.
fn simulate(
    a: Adaptive,
    knee: i64,
    clients: usize,
    duration: i64,
    drop_from: i64,
    seed: u64,
) -> Run {
    let mut rng = Lcg(seed);
    let mut stored: Option<State> = None;
    let mut running = 0i64;
    let mut run = Run {
        limits: vec![(0, a.limit(None))],
        most_running: 0,
    };
    let mut events = BinaryHeap::new();
    for c in 0..clients {
        events.push(Reverse((rng.below(TARGET), c, Step::Acquire)));
    }
    while let Some(Reverse((now, client, step))) = events.pop() {
        if now >= duration {
            break;
        }
        match step {
            Step::Acquire => {
                let limit = a.limit(stored);
                if running < limit {
                    running += 1;
                    run.most_running = run.most_running.max(running);
                    assert!(running <= a.max(), "more calls than the maximum");
                    let latency = if running > knee {
                        2 * TARGET + rng.below(TARGET / 5)
                    } else {
                        TARGET / 2 + rng.below(TARGET / 5)
                    };
                    let release = Step::Release {
                        acquired_at: now,
                        latency,
                    };
                    events.push(Reverse((now + latency, client, release)));
                } else {
                    events.push(Reverse((now + TARGET / 10, client, Step::Acquire)));
                }
            }
            Step::Release {
                acquired_at,
                latency,
            } => {
                running -= 1;
                let report = if now >= drop_from {
                    Report::Dropped
                } else {
                    Report::Ok
                };
                let before = a.limit(stored);
                if let Some(new) = a.after_release(stored, acquired_at, now, latency, report) {
                    stored = Some(new);
                }
                let after = a.limit(stored);
                if after != before {
                    run.limits.push((now, after));
                }
                events.push(Reverse((now, client, Step::Acquire)));
            }
        }
    }
    run
}

/// A round: the longest a call takes in the simulation (twice the target and its jitter).
const ROUND: i64 = 2 * TARGET + TARGET / 5;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// With three times as many clients as the backend serves well, the limit comes down from its
    /// maximum and settles within 20% of the knee `C` (its mean over the last 200 rounds), and never
    /// lets more calls run than its maximum.
    #[test]
    fn the_limit_settles_within_a_fifth_of_what_the_backend_serves_well(
        knee in 10i64..=80,
        headroom in 2i64..=4,
        seed in any::<u64>(),
    ) {
        let a = Adaptive::new(1, (knee * headroom).min(MAX), TARGET).expect("settings");
        let duration = 400 * ROUND;
        let run = simulate(a, knee, usize::try_from(3 * knee).expect("clients"), duration, i64::MAX, seed);
        let mean = run.mean(duration / 2, duration);
        let c = knee as f64;
        prop_assert!(
            (0.8 * c..=1.2 * c).contains(&mean),
            "knee {knee}: mean limit {mean:.1} over the last 200 rounds"
        );
        prop_assert!(run.most_running <= a.max());
    }

    /// Once settled, the backend starts dropping every call: the limit is below what it was within one
    /// round (the calls running then end within it), and it falls to `min` and stays there.
    #[test]
    fn the_limit_backs_off_within_one_round_of_the_first_drop(
        knee in 10i64..=80,
        seed in any::<u64>(),
    ) {
        let a = Adaptive::new(2, (knee * 3).min(MAX), TARGET).expect("settings");
        let drop_from = 200 * ROUND;
        let duration = 300 * ROUND;
        let run = simulate(a, knee, usize::try_from(3 * knee).expect("clients"), duration, drop_from, seed);
        let before = run.limit_at(drop_from);
        let backed_off = run.first_below(drop_from, before).expect("a decrease");
        prop_assert!(
            backed_off - drop_from <= ROUND,
            "the first decrease came {} µs after the first drop",
            backed_off - drop_from
        );
        prop_assert_eq!(run.limit_at(duration), a.min());
    }
}

/// The largest maximum the simulations use.
const MAX: i64 = super::super::MAX_LEASES;

#[test]
fn a_good_call_adds_one_lease_per_round_of_limit_calls() {
    let a = Adaptive::new(1, 100, TARGET).expect("settings");
    let mut s = Some(State {
        level: 10 * UNITS,
        at: 0,
    });
    // 100, 99, 98, ... thousandths: ten calls (a round at 10) add 956 thousandths, an eleventh the rest
    for _ in 0..10 {
        s = a.after_release(s, 1, 2, TARGET, Report::Ok).or(s);
    }
    assert_eq!(s.map(|s| s.level), Some(10_956));
    assert_eq!(a.limit(s), 10);
    s = a.after_release(s, 1, 2, TARGET, Report::Ok).or(s);
    assert_eq!(
        s,
        Some(State {
            level: 11_047,
            at: 0
        })
    );
    assert_eq!(a.limit(s), 11);
    // at the maximum nothing is written
    assert_eq!(a.after_release(None, 1, 2, TARGET, Report::Ok), None);
}

#[test]
fn a_bad_call_cuts_the_limit_once_per_round() {
    let a = Adaptive::new(3, 100, TARGET).expect("settings");
    let cut = a
        .after_release(None, 10, 20, TARGET + 1, Report::Ok)
        .expect("a decrease");
    assert_eq!(
        cut,
        State {
            level: 90 * UNITS,
            at: 20
        }
    );
    // a call acquired before that decrease changes nothing, whatever it reports
    for report in [Report::Ok, Report::Dropped, Report::TimedOut] {
        assert_eq!(
            a.after_release(Some(cut), 19, 30, 10 * TARGET, report),
            None
        );
    }
    // one acquired at or after it cuts again
    let again = a
        .after_release(Some(cut), 20, 40, 0, Report::TimedOut)
        .expect("a decrease");
    assert_eq!(
        again,
        State {
            level: 81 * UNITS,
            at: 40
        }
    );
    // never below the minimum
    let low = Some(State {
        level: 3 * UNITS,
        at: 0,
    });
    assert_eq!(
        a.after_release(low, 5, 6, 0, Report::Dropped),
        Some(State {
            level: 3 * UNITS,
            at: 6
        })
    );
    assert_eq!(a.limit(low), 3);
}

#[test]
fn settings_are_checked() {
    assert_eq!(Adaptive::new(0, 10, 1), Err(AdaptiveError::Min));
    assert_eq!(Adaptive::new(11, 10, 1), Err(AdaptiveError::Min));
    assert_eq!(Adaptive::new(1, 0, 1), Err(AdaptiveError::Max));
    assert_eq!(Adaptive::new(1, MAX + 1, 1), Err(AdaptiveError::Max));
    assert_eq!(Adaptive::new(1, 10, 0), Err(AdaptiveError::Target));
    assert_eq!(Report::parse("timeout"), Some(Report::TimedOut));
    assert_eq!(Report::parse("late"), None);
}

/// The figures behind the properties' bounds, for a reader (`cargo test -- --ignored --nocapture`).
#[test]
#[ignore]
fn print_settled_means() {
    for knee in [10, 20, 40, 80] {
        let a = Adaptive::new(1, knee * 4, TARGET).expect("settings");
        let duration = 400 * ROUND;
        let run = simulate(
            a,
            knee,
            usize::try_from(3 * knee).expect("clients"),
            duration,
            i64::MAX,
            7,
        );
        let tail: Vec<i64> = run
            .limits
            .iter()
            .filter(|(at, _)| *at > duration / 2)
            .map(|(_, l)| *l)
            .collect();
        println!(
            "knee {knee}: mean {:.2}, between {} and {}, most running {}",
            run.mean(duration / 2, duration),
            tail.iter().min().unwrap_or(&0),
            tail.iter().max().unwrap_or(&0),
            run.most_running
        );
    }
}

/// A limit bucket of at most 10 leases of 30 s.
fn bucket() -> Policy {
    Policy::adaptive_limit(10, 30 * 1_000_000).expect("numbers")
}

#[test]
fn a_limit_bucket_is_full_at_its_most_and_forgotten_one_lease_ttl_after_its_last_decrease() {
    let p = bucket();
    let a = Adaptive::new(2, 10, TARGET).expect("settings");
    let t = 1_000_000;
    // a missing limit is at its most: a report of a good call changes nothing, a bad one cuts it
    assert_eq!(p.full(t).level, 10 * UNITS);
    assert!(p.is_full(p.full(t), t));
    let ok = p.adapt(p.full(t), t, a, t - 1, TARGET, Report::Ok);
    assert!(!ok.allowed);
    assert_eq!(ok.remaining, 10);
    let cut = p.adapt(p.full(t), t, a, t - 1, 0, Report::Dropped);
    assert!(cut.allowed);
    assert_eq!(
        cut.state,
        State {
            level: 9 * UNITS,
            at: t
        }
    );
    assert_eq!(cut.remaining, 9);
    assert!(!p.is_full(cut.state, t));
    assert_eq!(p.take(cut.state, t, 0).reset_after, 30 * 1_000_000);
    // one lease TTL after the decrease it is forgotten: full (the purge may delete it), at its most
    let later = t + 30 * 1_000_000;
    assert!(!p.is_full(cut.state, later - 1));
    assert!(p.is_full(cut.state, later));
    assert_eq!(p.take(cut.state, later, 0).remaining, 10);
    assert_eq!(p.limit_in_force(cut.state, later), None);
    // a bad call acquired before the forgotten decrease cuts again (its round is long over)
    let again = p.adapt(cut.state, later, a, t - 1, 0, Report::TimedOut);
    assert_eq!(
        again.state,
        State {
            level: 9 * UNITS,
            at: later
        }
    );
    // good calls that bring it back to its most leave a full bucket
    let mut s = State {
        level: 10 * UNITS - 1,
        at: t,
    };
    let up = p.adapt(s, t + 1, a, t, 0, Report::Ok);
    assert!(up.allowed && p.is_full(up.state, t + 1));
    s.level = 10 * UNITS;
    assert!(!p.adapt(s, t + 1, a, t, 0, Report::Ok).allowed);
}

#[test]
fn a_limit_carries_over_a_change_of_the_most_leases() {
    let p = bucket();
    let cut = State {
        level: 8 * UNITS,
        at: 5,
    };
    let fewer = Policy::adaptive_limit(6, 30 * 1_000_000).expect("numbers");
    assert_eq!(
        fewer.carry_over(cut, &p, 6, 6),
        State {
            level: 6 * UNITS,
            at: 5
        }
    );
    assert!(fewer.is_full(fewer.carry_over(cut, &p, 6, 6), 6));
    let more = Policy::adaptive_limit(20, 30 * 1_000_000).expect("numbers");
    assert_eq!(more.carry_over(cut, &p, 6, 6), cut);
    // a limit that was at its most is at the new most
    assert_eq!(more.carry_over(p.full(5), &p, 6, 6).level, 20 * UNITS);
    assert_eq!(limit_namespace("api"), "api\u{1f}adaptive limit");
}
