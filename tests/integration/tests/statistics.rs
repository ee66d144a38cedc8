//! Statistics from many connections: every call is counted exactly (calls, grants, denials, tokens) in
//! both stores, the most denied key heads `rate_limit.top_limited` with its exact count once the
//! connections have closed (a backend adds its last batch of denials when it exits), a multi-limit
//! call counts the denial against the policy that refused it, `rate_limit.track_stats = off` counts
//! nothing, and a server without preloading answers 55000 with a hint.

use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use rate_limit_integration::{env, TestDb};

const THREADS: usize = 16;
const HOT: usize = 40;
const COLD: usize = 10;

fn totals(c: &mut Client, policy: &str) -> (i64, i64, i64, i64) {
    let r = c
        .query_one(
            "SELECT calls, granted, denied, tokens_granted FROM rate_limit.stats WHERE policy = $1",
            &[&policy],
        )
        .expect("stats row");
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// 16 connections: 40 takes each of key `hot` (one bucket of 100: 100 grants, 540 denials) and 10 of a
/// key of their own (never short). Totals: 800 calls, 260 granted, 540 denied, 260 tokens; `hot` denied
/// exactly 540 times (fewer keys than counters: the summary is exact).
fn counts_are_exact(store: &str) {
    let db = TestDb::new(&format!("stats_exact_{store}"));
    let mut admin = db.connect();
    admin
        .execute(
            "SELECT rate_limit.create_policy('counted', 100, '400 days', store => $1)",
            &[&store],
        )
        .expect("policy");
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut c = db.connect();
            thread::spawn(move || {
                for i in 0..HOT + COLD {
                    let key = if i < HOT {
                        "hot".to_string()
                    } else {
                        format!("cold{t}")
                    };
                    c.query_one(
                        "SELECT allowed FROM rate_limit.take('counted', $1)",
                        &[&key],
                    )
                    .expect("take");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let calls = (THREADS * (HOT + COLD)) as i64;
    let hot_denied = (THREADS * HOT) as i64 - 100;
    assert_eq!(
        totals(&mut admin, "counted"),
        (calls, calls - hot_denied, hot_denied, calls - hot_denied),
        "{store} store"
    );
    // each backend adds its last denials to the summary when it exits, just after its client leaves
    let deadline = Instant::now() + Duration::from_secs(10);
    let top = loop {
        let top: Vec<(i32, String, i64, i64)> = admin
            .query(
                "SELECT rank, key, denials, denials_min FROM rate_limit.top_limited WHERE policy = 'counted'",
                &[],
            )
            .expect("top_limited")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
        if top.first().is_some_and(|t| t.2 == hot_denied) || Instant::now() > deadline {
            break top;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        top,
        vec![(1, "hot".to_string(), hot_denied, hot_denied)],
        "only hot was denied, every denial in the summary"
    );
    let last: bool = admin
        .query_one(
            "SELECT last_denial BETWEEN since AND now() FROM rate_limit.stats WHERE policy = 'counted'",
            &[],
        )
        .expect("last_denial")
        .get(0);
    assert!(last);
}

#[test]
fn counts_are_exact_table_store() {
    counts_are_exact("table");
}

#[test]
fn counts_are_exact_memory_store() {
    counts_are_exact("memory");
}

#[test]
fn a_multi_limit_denial_counts_against_the_refusing_policy() {
    let db = TestDb::new("stats_multi");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT rate_limit.create_policy('roomy', 100, '400 days');
         SELECT rate_limit.create_policy('tight', 1, '400 days');
         SELECT rate_limit.take_many(ARRAY['roomy', 'tight'], ARRAY['k']) FROM generate_series(1, 3);",
    )
    .expect("calls");
    assert_eq!(
        totals(&mut c, "roomy"),
        (3, 1, 0, 1),
        "roomy: granted once, refused by tight twice"
    );
    assert_eq!(totals(&mut c, "tight"), (3, 1, 2, 1));
    // reset one policy: its counters start again, the other keeps its own
    let reset: i64 = c
        .query_one("SELECT rate_limit.reset_stats('tight')", &[])
        .expect("reset")
        .get(0);
    assert_eq!(reset, 1);
    assert_eq!(totals(&mut c, "tight"), (0, 0, 0, 0));
    assert_eq!(totals(&mut c, "roomy"), (3, 1, 0, 1));
    let listed: i64 = c
        .query_one(
            "SELECT count(*) FROM rate_limit.top_limited WHERE policy = 'tight'",
            &[],
        )
        .expect("top")
        .get(0);
    assert_eq!(listed, 0);
}

#[test]
fn nothing_is_counted_with_track_stats_off() {
    let db = TestDb::new("stats_off");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT rate_limit.create_policy('quiet', 1, '400 days');
         SELECT rate_limit.take('quiet', 'k');
         SET rate_limit.track_stats = off;
         SELECT rate_limit.take('quiet', 'k') FROM generate_series(1, 5);",
    )
    .expect("calls");
    assert_eq!(totals(&mut c, "quiet"), (1, 1, 0, 1));
}

#[test]
fn without_preloading_the_views_raise_55000() {
    let db = TestDb::on(&env("RATE_LIMIT_TEST_PLAIN_CONNINFO"), "stats_plain");
    let mut c = db.connect();
    for sql in [
        "SELECT * FROM rate_limit.stats",
        "SELECT * FROM rate_limit.top_limited",
        "SELECT rate_limit.reset_stats()",
    ] {
        let e = c.query(sql, &[]).expect_err(sql);
        assert_eq!(
            e.code(),
            Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE),
            "{sql}"
        );
        let hint = e.as_db_error().and_then(|d| d.hint()).unwrap_or_default();
        assert!(hint.contains("shared_preload_libraries"), "{sql}: {hint}");
    }
    // the table store works, uncounted
    let left: i32 = c
        .query_one("SELECT rate_limiting_request('k', 1, 10)", &[])
        .expect("request")
        .get(0);
    assert_eq!(left, 9);
}
