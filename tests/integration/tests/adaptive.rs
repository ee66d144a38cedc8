//! Adaptive concurrency against a real server, in every store of the edition under test:
//! - a simulated backend whose calls take 60 ms while at most C run at once and 240 ms beyond (latency
//!   target 120 ms: half the target and twice it, as the model's simulation; long beside a call's own
//!   round trips, during which a lease is held and no call runs), called by 3C connections without pause
//!   through one key's leases of an adaptive policy of at most 4C: the key's limit, sampled every 25 ms
//!   over the second half of the run, averages within 20% of C; the calls running at once never exceed
//!   the policy's most leases. Then the backend drops every call: the limit is lower within one round
//!   (the longest call, 240 ms; asserted with slack for a loaded machine) and falls to the minimum;
//! - the arithmetic end to end, read back through `acquire`'s `remaining`: a drop cuts the limit to 9/10
//!   once per round, good calls raise it, the minimum holds, and a limit is forgotten one lease TTL after
//!   its last cut (so the purge can delete it: a row per key any caller could otherwise leave behind);
//! - a role with only LOGIN reports on the leases it holds and on no other (a made-up id is refused and
//!   cuts nothing), with the owner's SQLSTATEs for misuse.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use rate_limit_integration::{stores, TestDb};

/// What the backend serves well at once.
const C: i64 = 10;
/// The policy's most leases.
const MAX: i64 = 4 * C;
const CONNECTIONS: usize = 3 * C as usize;
const FAST: Duration = Duration::from_millis(60);
const SLOW: Duration = Duration::from_millis(240);
const SETTLE: Duration = Duration::from_secs(10);

fn acquire(c: &mut Client, key: &str) -> Option<i64> {
    c.query_one(
        "SELECT lease FROM rate_limit.acquire('backend', $1)",
        &[&key],
    )
    .expect("acquire")
    .get(0)
}

fn release(
    c: &mut Client,
    key: &str,
    lease: i64,
    outcome: &str,
    latency: Option<Duration>,
) -> bool {
    let latency_us = latency.map(|l| i64::try_from(l.as_micros()).expect("short"));
    c.query_one(
        "SELECT rate_limit.release('backend', $1, $2, $3, $4::float8 * interval '1 microsecond')",
        &[&key, &lease, &outcome, &latency_us.map(|l| l as f64)],
    )
    .expect("release")
    .get(0)
}

/// The key's limit in leases as `rate_limit.buckets` shows it; `MAX` while it has no limit bucket.
fn limit(c: &mut Client, key: &str) -> f64 {
    c.query_opt(
        "SELECT tokens::float8 FROM rate_limit.buckets \
         WHERE policy = 'backend' AND key = $1 AND algorithm = 'adaptive_limit'",
        &[&key],
    )
    .expect("the limit")
    .map_or(MAX as f64, |r| r.get(0))
}

fn adaptive_policy(db: &TestDb, store: &str, ttl: &str, min: i64, target: &str) {
    db.connect()
        .execute(
            "SELECT rate_limit.create_policy('backend', $1, $2::text::interval, algorithm => 'concurrency', \
             store => $3, options => jsonb_build_object('latency_target', $4::text, 'adaptive_min', $5::bigint))",
            &[&MAX, &ttl, &store, &target, &min],
        )
        .expect("policy");
}

fn settles_near_what_the_backend_serves_well(store: &str) {
    let db = TestDb::new(&format!("adaptive_{store}"));
    adaptive_policy(&db, store, "1 minute", 1, "120 milliseconds");
    let running = Arc::new(AtomicI64::new(0));
    let most_running = Arc::new(AtomicI64::new(0));
    let dropping = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CONNECTIONS + 1));
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let mut c = db.connect();
            let (running, most_running) = (running.clone(), most_running.clone());
            let (dropping, done, start) = (dropping.clone(), done.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                while !done.load(Ordering::SeqCst) {
                    let Some(lease) = acquire(&mut c, "k") else {
                        thread::sleep(Duration::from_millis(2));
                        continue;
                    };
                    let now_running = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most_running.fetch_max(now_running, Ordering::SeqCst);
                    let began = Instant::now();
                    let (outcome, sleep) = if dropping.load(Ordering::SeqCst) {
                        ("dropped", Duration::from_millis(1))
                    } else if now_running <= C {
                        ("ok", FAST)
                    } else {
                        ("ok", SLOW)
                    };
                    thread::sleep(sleep);
                    let latency = began.elapsed();
                    running.fetch_sub(1, Ordering::SeqCst);
                    assert!(
                        release(&mut c, "k", lease, outcome, Some(latency)),
                        "a held lease is released once"
                    );
                }
            })
        })
        .collect();
    let mut monitor = db.connect();
    start.wait();
    let began = Instant::now();
    let mut samples = Vec::new();
    while began.elapsed() < SETTLE {
        let l = limit(&mut monitor, "k");
        if began.elapsed() >= SETTLE / 2 {
            samples.push(l);
        }
        thread::sleep(Duration::from_millis(25));
    }
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    let before = limit(&mut monitor, "k");
    dropping.store(true, Ordering::SeqCst);
    let dropped_at = Instant::now();
    let mut lower_after = None;
    let mut lowest = before;
    while dropped_at.elapsed() < Duration::from_secs(3) {
        let l = limit(&mut monitor, "k");
        if l < before && lower_after.is_none() {
            lower_after = Some(dropped_at.elapsed());
        }
        lowest = lowest.min(l);
        thread::sleep(Duration::from_millis(5));
    }
    done.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().expect("client");
    }
    eprintln!(
        "{store}: mean limit {mean:.2} over {} samples of the second half (C = {C}), most running {}, \
         lower {lower_after:?} after the first drop, lowest {lowest}",
        samples.len(),
        most_running.load(Ordering::SeqCst)
    );
    let c = C as f64;
    assert!(
        (0.8 * c..=1.2 * c).contains(&mean),
        "{store}: the limit settles within 20% of {C}: mean {mean:.2}"
    );
    assert!(
        most_running.load(Ordering::SeqCst) <= MAX,
        "{store}: never more calls at once than the policy's most leases"
    );
    let lower_after = lower_after.expect("the limit backs off once the backend drops calls");
    // one round is the longest call (240 ms); the slack covers a loaded two-core machine's scheduling
    assert!(
        lower_after <= SLOW * 2,
        "{store}: lower within one round of the first drop, took {lower_after:?}"
    );
    assert!(
        lowest < 1.5,
        "{store}: a backend that drops everything brings the limit to its minimum of 1: {lowest}"
    );
}

#[test]
fn the_limit_settles_near_what_the_backend_serves_well_and_backs_off_on_drops() {
    for store in stores() {
        settles_near_what_the_backend_serves_well(store);
    }
}

/// `remaining` after an acquire with every lease free: the key's limit less the lease just taken.
fn limit_by_acquire(c: &mut Client, key: &str) -> i64 {
    let row = c
        .query_one(
            "SELECT allowed, remaining, lease FROM rate_limit.acquire('backend', $1)",
            &[&key],
        )
        .expect("acquire");
    assert!(row.get::<_, bool>(0), "a free slot below the limit");
    let lease: i64 = row.get(2);
    assert!(release(c, key, lease, "ok", Some(Duration::ZERO)));
    row.get::<_, i64>(1) + 1
}

fn exact_reports(store: &str) {
    let db = TestDb::new(&format!("adaptive_exact_{store}"));
    adaptive_policy(&db, store, "2 seconds", 36, "100 milliseconds");
    let mut c = db.connect();
    // a new key is at its most
    let leases: Vec<i64> = (0..MAX)
        .map(|_| acquire(&mut c, "k").expect("40 leases"))
        .collect();
    assert_eq!(acquire(&mut c, "k"), None);
    // a drop cuts 40 to 36 (never below the minimum of 36); the others, acquired before the cut, do not
    // cut it again, whatever they report
    assert!(release(
        &mut c,
        "k",
        leases[0],
        "dropped",
        Some(Duration::ZERO)
    ));
    for (n, &lease) in leases[1..].iter().enumerate() {
        let outcome = if n % 2 == 0 { "timeout" } else { "ok" };
        assert!(release(&mut c, "k", lease, outcome, Some(Duration::ZERO)));
    }
    // the 19 good ones ("ok", n odd) add 1/limit each, in whole thousandths
    let raised = (0..19).fold(36_000_i64, |level, _| level + 1_000_000 / level);
    assert_eq!(limit(&mut c, "k"), raised as f64 / 1000.0, "{store}");
    assert_eq!(limit_by_acquire(&mut c, "k"), 36, "{store}");
    // a slow call acquired after the cut cuts again, to the minimum
    let lease = acquire(&mut c, "k").expect("a lease");
    assert!(release(
        &mut c,
        "k",
        lease,
        "ok",
        Some(Duration::from_millis(101))
    ));
    assert_eq!(limit(&mut c, "k"), 36.0, "{store}: never below the minimum");
    // one lease TTL (2 s) after its last cut the limit is forgotten: back at its most
    thread::sleep(Duration::from_millis(2100));
    assert_eq!(limit_by_acquire(&mut c, "k"), MAX, "{store}: forgotten");
    assert_eq!(
        limit(&mut c, "k"),
        MAX as f64,
        "{store}: full, as a missing one"
    );
}

#[test]
fn reports_move_the_limit_exactly_and_an_idle_limit_is_forgotten() {
    for store in stores() {
        exact_reports(store);
    }
}

fn a_login_role_reports_only_on_its_own_leases(store: &str) {
    let db = TestDb::new(&format!("adaptive_role_{store}"));
    adaptive_policy(&db, store, "1 minute", 1, "100 milliseconds");
    let mut owner = db.connect();
    let owners = acquire(&mut owner, "k").expect("the owner's lease");
    let mut role = db.connect_as_login_role("rl_adaptive");
    // a report on a lease the role holds moves the key's limit: 40 to 36
    let first = acquire(&mut role, "k").expect("the role's lease");
    assert!(release(
        &mut role,
        "k",
        first,
        "dropped",
        Some(Duration::ZERO)
    ));
    assert_eq!(limit(&mut owner, "k"), 36.0, "{store}");
    // a lease acquired after that cut would cut again; a report on an id the role does not hold is
    // refused (false) and cuts nothing, however often it is sent
    let second = acquire(&mut role, "k").expect("a lease below the new limit");
    for made_up in [second + 1, second - 1, 0, i64::MAX, owners ^ 1] {
        if made_up == owners || made_up == second {
            continue;
        }
        for outcome in ["dropped", "timeout"] {
            assert!(
                !release(&mut role, "k", made_up, outcome, Some(Duration::ZERO)),
                "{store}: no report on lease {made_up}, which nobody holds"
            );
        }
    }
    assert_eq!(
        limit(&mut owner, "k"),
        36.0,
        "{store}: refused reports cut nothing"
    );
    // its own lease, acquired after the cut, does cut: 36 to 32.4
    assert!(release(
        &mut role,
        "k",
        second,
        "timeout",
        Some(Duration::ZERO)
    ));
    assert_eq!(limit(&mut owner, "k"), 32.4, "{store}");
    // misuse gets its SQLSTATE as the owner's would
    let third = acquire(&mut role, "k").expect("a third lease");
    for (outcome, latency, state) in [
        (Some("fine"), "1 millisecond", "22023"),
        (None, "1 millisecond", "22004"),
        (Some("ok"), "-1 millisecond", "22023"),
        (Some("ok"), "1 month", "22023"),
    ] {
        let err = role
            .query_one(
                "SELECT rate_limit.release('backend', 'k', $1, $2, $3::text::interval)",
                &[&third, &outcome, &latency],
            )
            .expect_err("misuse");
        assert_eq!(
            err.code().map(|c| c.code()),
            Some(state),
            "{store}: {outcome:?} {latency}: {err}"
        );
    }
    assert!(release(&mut role, "k", third, "ok", Some(Duration::ZERO)));
    // the owner's lease was never touched by any of it
    assert!(release(&mut owner, "k", owners, "ok", Some(Duration::ZERO)));
    drop(role);
    owner
        .batch_execute("DROP ROLE rl_adaptive")
        .expect("drop the role");
}

/// A role with LOGIN and nothing else may report on the leases it holds (a report moves the key's limit,
/// as any caller of the policy may), is refused a report on a lease id it does not hold (`false`, the
/// limit untouched, even where a real report would cut), and gets the same SQLSTATEs for misuse.
#[test]
fn a_login_role_reports_only_on_leases_it_holds() {
    for store in stores() {
        a_login_role_reports_only_on_its_own_leases(store);
    }
}
