//! The algorithms against exact models: every figure a decision reports, carry-over, refunds.

use super::*;
use proptest::prelude::*;

const S: i64 = 1_000_000;

fn policy(algorithm: Algorithm, rate: i64, period: i64, burst: i64) -> Policy {
    Policy::new(algorithm, rate, period, burst).expect("valid test policy")
}

/// Runs calls `(instant, cost)` from a missing bucket, returning each outcome.
fn run(p: &Policy, calls: &[(i64, i64)]) -> Vec<Outcome> {
    let mut state: Option<State> = None;
    calls
        .iter()
        .map(|&(now, cost)| {
            let o = p.take(state.unwrap_or_else(|| p.full(now)), now, cost);
            if o.allowed {
                state = Some(o.state);
            }
            o
        })
        .collect()
}

#[test]
fn names_round_trip() {
    for a in Algorithm::ALL {
        assert_eq!(Algorithm::parse(a.name()), Some(a));
        assert_eq!(Algorithm::from_code(a.code()), Some(a));
    }
    assert_eq!(Algorithm::parse("leaky"), None);
    // the generic cell rate algorithm is the token bucket under another name
    assert_eq!(Algorithm::parse(GCRA), Some(Algorithm::TokenBucket));
    assert_eq!(Algorithm::TokenBucket.name(), "token_bucket");
}

#[test]
fn window_policies_need_burst_equal_to_rate() {
    assert_eq!(
        Policy::new(Algorithm::FixedWindow, 10, S, 20),
        Err(PolicyError::WindowBurstNotRate)
    );
    assert_eq!(
        Policy::new(
            Algorithm::SlidingWindow,
            MAX_WINDOW_COUNT + 1,
            S,
            MAX_WINDOW_COUNT + 1
        ),
        Err(PolicyError::WindowTooLarge)
    );
    assert!(Policy::new(Algorithm::TokenBucket, 10, S, 20).is_ok());
}

#[test]
fn token_bucket_decision_values() {
    // 10 per minute, burst 5: one token every 6 s
    let p = policy(Algorithm::TokenBucket, 10, 60 * S, 5);
    let t0 = 1_000 * S;
    let o = run(&p, &[(t0, 1), (t0, 4), (t0, 1)]);
    assert_eq!((o[0].allowed, o[0].remaining), (true, 4));
    assert_eq!(o[0].reset_after, 6 * S);
    assert_eq!((o[1].allowed, o[1].remaining), (true, 0));
    assert_eq!(o[1].reset_after, 30 * S);
    assert!(!o[2].allowed);
    assert_eq!(o[2].retry_after, Some(6 * S));
    assert_eq!(o[2].remaining, 0);
    // cost above burst: never
    let o = p.take(p.full(t0), t0, 6);
    assert_eq!((o.allowed, o.retry_after, o.remaining), (false, None, 5));
    // cost 0 peeks
    let o = p.take(p.full(t0), t0, 0);
    assert_eq!((o.allowed, o.remaining, o.reset_after), (true, 5, 0));
}

#[test]
fn fixed_window_restores_everything_at_the_boundary() {
    let p = policy(Algorithm::FixedWindow, 3, 10 * S, 3);
    let t0 = 100 * S + 4 * S; // 4 s into the window [100 s, 110 s)
    let o = run(
        &p,
        &[
            (t0, 1),
            (t0, 1),
            (t0, 1),
            (t0, 1),
            (110 * S, 1),
            (110 * S, 2),
        ],
    );
    assert_eq!(
        o.iter().map(|o| o.allowed).collect::<Vec<_>>(),
        vec![true, true, true, false, true, true]
    );
    assert_eq!(o[0].reset_after, 6 * S);
    assert_eq!(o[3].retry_after, Some(6 * S));
    assert_eq!(o[3].remaining, 0);
    assert_eq!(o[4].remaining, 2);
    assert_eq!(o[5].remaining, 0);
}

#[test]
fn sliding_window_weights_the_previous_window() {
    let p = policy(Algorithm::SlidingWindow, 10, 10 * S, 10);
    // 10 calls at the end of window [0, 10 s), then calls in [10 s, 20 s)
    let mut calls: Vec<(i64, i64)> = (0..10).map(|_| (9 * S, 1)).collect();
    calls.push((10 * S, 1)); // weight of previous = 1.0 → 10, denied
    calls.push((15 * S, 1)); // weight 0.5 → 5 used: granted (6 used)
    let o = run(&p, &calls);
    assert!(o[..10].iter().all(|o| o.allowed));
    assert!(!o[10].allowed);
    // at 10 s: 10 × (10 − e) <= (10 − 0 − 1) × 10 ⇔ e >= 1 s
    assert_eq!(o[10].retry_after, Some(S));
    assert!(o[11].allowed);
    assert_eq!(o[11].remaining, 4);
    // full when the current window's calls have aged out: at 30 s
    assert_eq!(o[11].reset_after, 15 * S);
}

#[test]
fn carry_over_never_grants_more() {
    let tb = policy(Algorithm::TokenBucket, 10, S, 100);
    let small = policy(Algorithm::TokenBucket, 1, S, 5);
    let t0 = 50 * S;
    let o = tb.take(tb.full(t0), t0, 97); // 3 left
    let carried = small.carry_over(o.state, &tb, t0, t0);
    assert_eq!(small.take(carried, t0, 0).remaining, 3);
    let bigger = policy(Algorithm::TokenBucket, 10, S, 1_000);
    let carried = bigger.carry_over(o.state, &tb, t0, t0);
    assert_eq!(bigger.take(carried, t0, 0).remaining, 3);
    // change took effect 1 s after the last grant: +10 under the old rate, then the new one
    let carried = small.carry_over(o.state, &tb, t0 + S, t0 + 2 * S);
    assert_eq!(small.take(carried, t0 + 2 * S, 0).remaining, 5);
    let fixed = policy(Algorithm::FixedWindow, 50, 60 * S, 50);
    let carried = fixed.carry_over(o.state, &tb, t0, t0);
    assert_eq!(fixed.take(carried, t0, 0).remaining, 3);
    // a full bucket is a missing one: full under the new numbers too
    let carried = bigger.carry_over(tb.full(t0), &tb, t0, t0);
    assert_eq!(bigger.take(carried, t0, 0).remaining, 1_000);
}

#[test]
fn refund_is_capped_at_the_capacity() {
    // a lease slot is given back by releasing its lease, not by a refund: see the lease tests; a block is
    // lifted by deleting it: see the block tests; a reservation is settled: see the reservation tests; an
    // adaptive limit follows releases: see the adaptive tests
    for a in Algorithm::ALL.into_iter().filter(|&a| {
        !matches!(
            a,
            Algorithm::Concurrency
                | Algorithm::Block
                | Algorithm::Reservation
                | Algorithm::AdaptiveLimit
        )
    }) {
        let p = policy(a, 5, 10 * S, 5);
        let t0 = 3 * S;
        let o = p.take(p.full(t0), t0, 4);
        let back = p.refund(o.state, t0, 2);
        assert_eq!(p.take(back, t0, 0).remaining, 3, "{a:?}");
        let back = p.refund(o.state, t0, 100);
        assert!(p.is_full(back, t0), "{a:?}");
    }
}

#[test]
fn backward_clock_grants_nothing() {
    // a calendar window ends when the wall clock reads its boundary: see the calendar tests; a lease slot,
    // a block bucket, a reservation's bucket and an adaptive limit hold no tokens to take: see their tests
    for a in Algorithm::ALL.into_iter().filter(|&a| {
        !matches!(
            a,
            Algorithm::CalendarWindow
                | Algorithm::Concurrency
                | Algorithm::Block
                | Algorithm::Reservation
                | Algorithm::AdaptiveLimit
        )
    }) {
        let p = policy(a, 2, 10 * S, 2);
        let t0 = 100 * S;
        let o = run(&p, &[(t0, 2), (t0 - 50 * S, 1)]);
        assert!(o[0].allowed && !o[1].allowed, "{a:?}: no token minted");
        // no freeze: the retry counts from the new time, at most one (sliding: two) windows
        let retry = o[1].retry_after.unwrap();
        assert!(retry > 0 && retry <= 20 * S, "{a:?}: {retry}");
        assert_eq!(o[1].state.at, t0 - 50 * S, "{a:?}: rebased");
    }
}

/// An exact sliding log: the tokens granted in the last `period` (the half-open interval
/// `(now − period, now]`).
fn log_count(log: &[(i64, i64)], now: i64, period: i64) -> i64 {
    log.iter()
        .filter(|&&(t, _)| t > now - period && t <= now)
        .map(|&(_, c)| c)
        .sum()
}

fn any_policy() -> impl Strategy<Value = Policy> {
    (0usize..3, 1i64..=20, 1i64..=5_000_000, 1i64..=20).prop_map(|(a, rate, period, burst)| {
        let algorithm = Algorithm::ALL[a];
        let burst = if algorithm == Algorithm::TokenBucket {
            burst
        } else {
            rate
        };
        policy(algorithm, rate, period, burst)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// For every algorithm, `retry_after` is exact: granted at that instant, denied one microsecond
    /// before; `reset_after` is exact: full at that instant, not one microsecond before; `remaining`
    /// is exactly the largest cost that would be granted now.
    #[test]
    fn retry_reset_and_remaining_are_exact(
        p in any_policy(),
        steps in prop::collection::vec((0i64..=3_000_000, 0i64..=4), 1..40),
        cost in 1i64..=25,
    ) {
        let mut now = 1_000_000_000i64;
        let mut state = p.full(now);
        for (gap, c) in steps {
            now += gap;
            let o = p.take(state, now, c);
            if o.allowed { state = o.state; }
        }
        let o = p.take(state, now, cost);
        match (o.allowed, o.retry_after) {
            (true, r) => prop_assert_eq!(r, None),
            (false, None) => prop_assert!(cost > p.burst()),
            (false, Some(r)) => {
                prop_assert!(r > 0);
                prop_assert!(p.take(state, now + r, cost).allowed);
                prop_assert!(!p.take(state, now + r - 1, cost).allowed);
            }
        }
        let peek = p.take(state, now, 0);
        prop_assert!(p.take(state, now, peek.remaining).allowed || peek.remaining == 0);
        prop_assert!(!p.take(state, now, peek.remaining + 1).allowed);
        let r = peek.reset_after;
        prop_assert!(p.is_full(state, now + r));
        if r > 0 {
            prop_assert!(!p.is_full(state, now + r - 1));
        }
    }

    /// A granted take given back at the same instant restores exactly the state before it (what the
    /// table store's multi-limit call relies on when a later bucket denies): the same tokens now and
    /// at every later instant.
    #[test]
    fn refund_of_a_take_at_its_instant_restores_the_bucket(p in any_policy(), used in 0i64..=20,
                                                             cost in 1i64..=20, gap in 0i64..=50_000_000,
                                                             later in 0i64..=50_000_000) {
        let t0 = 1_000_000_000;
        let start = p.take(p.full(t0), t0, used.min(p.burst())).state;
        let now = t0 + gap;
        let taken = p.take(start, now, cost);
        prop_assume!(taken.allowed);
        let back = p.refund(taken.state, taken.state.at, cost);
        for t in [now, now + later] {
            prop_assert_eq!(p.tokens_exact(back, t), p.tokens_exact(start, t));
        }
    }

    /// Carrying a bucket in use over to another policy never adds tokens; a full one stays full.
    #[test]
    fn carry_over_never_adds(from in any_policy(), to in any_policy(), used in 0i64..=20,
                             gap in 0i64..=10_000_000) {
        let t0 = 7_000_000_000i64;
        let o = from.take(from.full(t0), t0, used.min(from.burst()));
        let now = t0 + gap;
        let before = from.tokens_exact(o.state, now);
        let carried = to.carry_over(o.state, &from, now, now);
        let after = to.tokens_exact(carried, now);
        if from.is_full(o.state, now) {
            prop_assert!(to.is_full(carried, now));
        } else {
            // after <= before, as fractions
            prop_assert!(after.0 * before.1 <= before.0 * after.1);
        }
    }

    /// Sliding window against an exact log of the calls it granted: a call is granted only when the
    /// weighted estimate leaves room, so (a) no aligned window ever holds more than `rate` grants,
    /// (b) no interval of one period ever holds more than twice `rate`, and (c) when the calls of the
    /// previous window were spread evenly, the estimate is within one token plus one call of the log.
    #[test]
    fn sliding_window_against_an_exact_log(
        rate in 1i64..=30,
        period in 1_000i64..=2_000_000,
        gaps in prop::collection::vec(0i64..=200_000, 1..300),
    ) {
        let p = policy(Algorithm::SlidingWindow, rate, period, rate);
        let mut now = 5_000_000_000i64;
        let mut state = p.full(now);
        let mut log: Vec<(i64, i64)> = Vec::new();
        for gap in gaps {
            now += gap;
            let o = p.take(state, now, 1);
            if o.allowed {
                state = o.state;
                log.push((now, 1));
            }
            let window = now.div_euclid(period);
            let in_window: i64 = log.iter().filter(|&&(t, _)| t.div_euclid(period) == window).count() as i64;
            prop_assert!(in_window <= rate);
            prop_assert!(log_count(&log, now, period) <= 2 * rate);
        }
    }
}

/// Evenly spaced traffic well above the limit: the sliding window grants the rate, and the number
/// granted in every interval of one period stays within one token of `rate` (the exact log's count).
#[test]
fn sliding_window_error_on_steady_traffic() {
    let rate = 100;
    let period = 10 * S;
    let p = policy(Algorithm::SlidingWindow, rate, period, rate);
    let mut state = p.full(0);
    let mut log = Vec::new();
    let mut now = 0;
    while now < 100 * period {
        let o = p.take(state, now, 1);
        if o.allowed {
            state = o.state;
            log.push((now, 1));
        }
        now += period / 1000; // 1000 calls per window, 10x the limit
    }
    let mut worst = 0;
    let mut t = 2 * period;
    while t < 100 * period {
        worst = worst.max(log_count(&log, t, period));
        t += period / 100;
    }
    assert!(worst <= rate + 1, "at most {worst} in one period");
    let granted = log.len() as i64;
    assert!((granted - 100 * rate).abs() <= rate, "granted {granted}");
}
