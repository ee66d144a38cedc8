//! The sharing against simulated clients: connections calling a parent's children without pause (or, for
//! a light child, now and then), every call decided at once as a store would decide it (the parent's
//! token bucket, then [`Fairness::admit`]), the grants logged and checked against the bound.

use super::*;
use crate::algorithm::{Algorithm, Policy, State};
use crate::test_support::Lcg;
use proptest::prelude::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const MS: i64 = 1000;
const S: i64 = 1_000_000;

/// One connection: the child it calls for, from when, and its pause between calls (µs, at most).
#[derive(Clone, Copy, Debug)]
struct Connection {
    child: usize,
    from: i64,
    pause: i64,
}

/// A run: every grant, in order, as (instant, child).
struct Run {
    grants: Vec<(i64, usize)>,
    /// Grants made while some hammering child was not demanding (the bound's premise broken).
    undemanding: Vec<(i64, usize)>,
}

/// A lead of one token at weight 1, a lag of three; demanding for 5 ms after a denial (the simulated
/// connections retry within 2 ms).
const FAIR: Fairness = Fairness {
    lead: UNITS,
    lag: 3 * UNITS,
    demand_us: 5 * MS,
};

/// A simulated parent and its clients.
struct World<'a> {
    /// The children's weights.
    weights: &'a [i64],
    /// The parent's tokens a second and burst.
    rate: i64,
    burst: i64,
    connections: &'a [Connection],
    /// How long it runs, µs.
    duration: i64,
    /// `hammering[i]`: child `i` is expected to stay demanding once its connections have run for
    /// `settle` µs.
    hammering: &'a [bool],
    settle: i64,
}

/// Runs `world` (every call of one token), with `seed` for the connections' pauses.
fn simulate(world: &World<'_>, seed: u64) -> Run {
    let World {
        weights,
        rate,
        burst,
        connections,
        duration,
        hammering,
        settle,
    } = *world;
    let mut rng = Lcg(seed);
    let parent = Policy::new(Algorithm::TokenBucket, rate, S, burst).expect("parent");
    let mut level: State = parent.full(0);
    let mut tags = vec![Tag::NEW; weights.len()];
    let mut front = 0i64;
    let mut run = Run {
        grants: Vec::new(),
        undemanding: Vec::new(),
    };
    let mut events = BinaryHeap::new();
    for (n, c) in connections.iter().enumerate() {
        events.push(Reverse((c.from + rng.below(MS), n)));
    }
    while let Some(Reverse((now, n))) = events.pop() {
        if now >= duration {
            break;
        }
        let c = connections[n];
        let i = c.child;
        let outcome = parent.take(level, now, 1);
        let admitted = FAIR.admit(tags[i], &tags, front, now);
        if outcome.allowed && admitted {
            level = outcome.state;
            (tags[i], front) = FAIR.granted(tags[i], front, 1, weights[i]);
            run.grants.push((now, i));
            let started = |j: usize| {
                connections
                    .iter()
                    .any(|k| k.child == j && k.from + settle <= now)
            };
            if (0..weights.len())
                .any(|j| hammering[j] && started(j) && !FAIR.demanding(tags[j], now))
            {
                run.undemanding.push((now, i));
            }
        } else {
            tags[i] = FAIR.denied(tags[i], now);
        }
        events.push(Reverse((now + 1 + rng.below(c.pause), n)));
    }
    run
}

/// Whether, over every interval within `[from, to)`, `g_i / w_i - g_j / w_j` (tokens, children of
/// [`WEIGHTS`]) stayed within
/// [`Fairness::bound`]: the running difference's highest value minus its lowest, counted exactly (in
/// `1 / (w_i w_j)` of a token), against the bound's `2 lead + 1 / w_i + 1 / w_j` (`lead` a whole number
/// of tokens here). `Err` with the spread in tokens.
fn within_bound(run: &Run, i: usize, j: usize, from: i64, to: i64) -> Result<(), String> {
    let (wi, wj) = (WEIGHTS[i], WEIGHTS[j]);
    let (mut d, mut lo, mut hi) = (0i64, 0i64, 0i64);
    for &(_, c) in run.grants.iter().filter(|(t, _)| (from..to).contains(t)) {
        if c == i {
            d += wj;
        } else if c == j {
            d -= wi;
        } else {
            continue;
        }
        lo = lo.min(d);
        hi = hi.max(d);
    }
    let bound = 2 * (FAIR.lead / UNITS) * wi * wj + wi + wj;
    if hi - lo <= bound {
        Ok(())
    } else {
        Err(format!(
            "children {i} and {j}: spread {:.3} > bound {:.3} tokens",
            (hi - lo) as f64 / (wi * wj) as f64,
            FAIR.bound(1, wi, wj)
        ))
    }
}

/// The grants of `child` (or of every child) within `[from, to)`.
fn grants(run: &Run, child: Option<usize>, from: i64, to: i64) -> i64 {
    run.grants
        .iter()
        .filter(|(t, c)| (from..to).contains(t) && child.is_none_or(|x| x == *c))
        .count() as i64
}

/// 16 connections spread over the children listed, from `from`.
fn hammer(children: &[usize], from: i64) -> Vec<Connection> {
    (0..16)
        .map(|n| Connection {
            child: children[n % children.len()],
            from,
            pause: 2 * MS,
        })
        .collect()
}

/// The most tokens any window of `len` µs granted.
fn busiest(run: &Run, len: i64) -> i64 {
    let times: Vec<i64> = run.grants.iter().map(|(t, _)| *t).collect();
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= len {
            start += 1;
        }
        most = most.max(i64::try_from(end - start + 1).unwrap_or(i64::MAX));
    }
    most
}

/// The children's weights of every simulation.
const WEIGHTS: [i64; 3] = [1, 2, 5];
/// How long every simulation runs.
const DURATION: i64 = 20 * S;

/// Runs [`DURATION`] of `connections` calling the children of [`WEIGHTS`] under a parent of `rate` and
/// `burst`; fails if a child of `hammering` was ever not demanding a second after its connections began.
fn run_three(
    rate: i64,
    burst: i64,
    connections: &[Connection],
    hammering: &[bool; 3],
    seed: u64,
) -> Result<Run, TestCaseError> {
    let world = World {
        weights: &WEIGHTS,
        rate,
        burst,
        connections,
        duration: DURATION,
        hammering,
        settle: S,
    };
    let run = simulate(&world, seed);
    prop_assert!(
        run.undemanding.is_empty(),
        "a hammering child not demanding: {:?}",
        &run.undemanding[..1]
    );
    Ok(run)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// 16 connections over three children of weights 1, 2 and 5, all hammering: the parent never grants
    /// more than its rate and burst in any second, every token it has goes out, and over every interval
    /// each pair's normalized grants differ by at most the bound.
    #[test]
    fn three_hammering_children_share_by_weight_within_the_bound(
        rate in 50i64..=400,
        // a bucket of a few tokens: one of a single token loses refill whenever a token waits at all
        burst in 5i64..=20,
        seed in any::<u64>(),
    ) {
        let connections = hammer(&[0, 1, 2], 0);
        let run = run_three(rate, burst, &connections, &[true; 3], seed)?;
        prop_assert!(busiest(&run, S) <= rate + burst, "a second granted {}", busiest(&run, S));
        // work-conserving: the parent's refill over the last 19 s all went out, but for what its bucket
        // may hold at the end
        let total = grants(&run, None, S, DURATION);
        prop_assert!(total >= 19 * rate - burst, "{total} of {} tokens", 19 * rate);
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            let checked = within_bound(&run, i, j, S, DURATION);
            prop_assert!(checked.is_ok(), "{:?}", checked);
        }
    }

    /// The child of weight 5 is idle for the first half: the other two take every token, 1 : 2 within
    /// the bound; when it comes back it catches up at most `lag` and then all three share within the
    /// bound again.
    #[test]
    fn an_idle_childs_share_is_lent_and_returned(
        rate in 50i64..=400,
        seed in any::<u64>(),
    ) {
        let half = DURATION / 2;
        let mut connections = hammer(&[0, 1], 0);
        connections.extend(hammer(&[2], half).into_iter().take(6));
        let run = run_three(rate, 10, &connections, &[true; 3], seed)?;
        let lent = grants(&run, None, S, half);
        prop_assert!(lent >= 9 * rate - 10, "while idle: {lent} of {} tokens", 9 * rate);
        let checked = within_bound(&run, 0, 1, S, half);
        prop_assert!(checked.is_ok(), "while idle: {:?}", checked);
        // back: within a second (catching up at most `lag`, 15 tokens at weight 5) it shares as before
        let settled = half + S;
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            let checked = within_bound(&run, i, j, settled, DURATION);
            prop_assert!(checked.is_ok(), "back: {:?}", checked);
        }
        let share = grants(&run, Some(2), settled, DURATION) as f64
            / grants(&run, None, settled, DURATION) as f64;
        prop_assert!((share - 5.0 / 8.0).abs() < 0.02, "the returning child's share {share:.3}");
    }

    /// A light child (weight 5, one call every 200 ms, far below its share) is granted every call and
    /// never holds back the two that hammer: they take the rest, 1 : 2 within the bound.
    #[test]
    fn a_light_child_never_holds_the_others_back(
        rate in 50i64..=400,
        seed in any::<u64>(),
    ) {
        let mut connections = hammer(&[0, 1], 0);
        connections.push(Connection { child: 2, from: 0, pause: 200 * MS });
        let run = run_three(rate, 10, &connections, &[true, true, false], seed)?;
        let total = grants(&run, None, S, DURATION);
        prop_assert!(total >= 19 * rate - 10, "{total} of {} tokens", 19 * rate);
        let checked = within_bound(&run, 0, 1, S, DURATION);
        prop_assert!(checked.is_ok(), "{:?}", checked);
    }
}

#[test]
fn a_tag_is_read_at_most_lag_below_the_front_and_grants_round_up() {
    let f = FAIR;
    let t = Tag {
        service: 5 * UNITS,
        denied_at: i64::MIN,
    };
    assert_eq!(f.effective(t, 20 * UNITS), 17 * UNITS);
    assert_eq!(f.effective(t, 6 * UNITS), 5 * UNITS);
    let (after, front) = f.granted(t, 6 * UNITS, 1, 3);
    assert_eq!(after.service, 5 * UNITS + 333_334);
    assert_eq!(front, 6 * UNITS);
    assert!(!f.demanding(t, 0));
    let d = f.denied(t, 100);
    assert!(f.demanding(d, 100 + f.demand_us));
    assert!(!f.demanding(d, 101 + f.demand_us));
}

#[test]
fn a_child_more_than_lead_above_the_floor_is_refused() {
    let f = FAIR;
    let now = 1000;
    let low = Tag {
        service: 10 * UNITS,
        denied_at: now,
    };
    let high = Tag {
        service: 11 * UNITS + 1,
        denied_at: now,
    };
    let tags = [low, high];
    assert!(!f.admit(high, &tags, 12 * UNITS, now));
    assert!(f.admit(low, &tags, 12 * UNITS, now));
    // once the low one stops demanding, nothing holds the high one back
    let later = now + f.demand_us + 1;
    assert!(f.admit(high, &tags, 12 * UNITS, later));
    assert!((f.bound(1, 1, 5) - 3.2).abs() < 1e-9);
}
