//! Charges after the fact against a real server: from many connections at once, charges and takes on one
//! key are exact in both stores (every token charged or granted is accounted for, none twice), a charge
//! never goes below the policy's `max_debt`, and in the table store a charge is part of the caller's
//! transaction (a ROLLBACK undoes it).

use std::thread;

use postgres::Client;
use rate_limit_integration::{compiled_only, TestDb};

const THREADS: usize = 8;
const CALLS: usize = 60;

/// The bucket's tokens now (negative in debt), from `rate_limit.buckets`.
fn tokens(c: &mut Client, policy: &str, key: &str) -> f64 {
    c.query_one(
        "SELECT tokens::float8 FROM rate_limit.buckets WHERE policy = $1 AND key = $2",
        &[&policy, &key],
    )
    .expect("buckets")
    .get(0)
}

/// Policy `llm`: 1 token a day, burst 1000, max_debt 100 000. Each of 8 connections alternates a charge
/// of 7 and a take of 3, 60 times. The charges all go through (3 360 tokens, never reaching the floor);
/// a take is granted only while 3 tokens are there. Afterwards the bucket holds exactly
/// 1000 − 3 360 − 3 × (takes granted), within the refill of the test's duration.
fn charges_and_takes_are_exact(store: &str) {
    let db = TestDb::new(&format!("charges_{store}"));
    let mut admin = db.connect();
    // 1 token a day, so that nothing refills while the test runs: raised past the 400-day default
    admin
        .batch_execute("SET rate_limit.max_policy_refill_time = '200000d'")
        .expect("raise the bound");
    admin
        .execute(
            "SELECT rate_limit.create_policy('llm', 1, '1 day', burst => 1000, max_debt => 100000, store => $1)",
            &[&store],
        )
        .expect("create policy");
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut c = db.connect();
            thread::spawn(move || {
                let mut granted = 0i64;
                for _ in 0..CALLS {
                    let charged: bool = c
                        .query_one("SELECT allowed FROM rate_limit.charge('llm', 'k', 7)", &[])
                        .expect("charge")
                        .get(0);
                    assert!(charged, "a charge is always allowed");
                    let took: bool = c
                        .query_one("SELECT allowed FROM rate_limit.take('llm', 'k', 3)", &[])
                        .expect("take")
                        .get(0);
                    granted += i64::from(took);
                }
                granted
            })
        })
        .collect();
    let granted: i64 = handles.into_iter().map(|h| h.join().expect("client")).sum();
    let expected = 1000.0 - 7.0 * (THREADS * CALLS) as f64 - 3.0 * granted as f64;
    let now = tokens(&mut admin, "llm", "k");
    assert!(
        now >= expected && now < expected + 0.01,
        "{now} tokens, expected {expected} ({granted} takes granted)"
    );
    assert!(granted <= 1000 / 3, "takes only while tokens were there");
}

#[test]
fn charges_and_takes_are_exact_in_the_table_store() {
    charges_and_takes_are_exact("table");
}

#[test]
fn charges_and_takes_are_exact_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    charges_and_takes_are_exact("memory");
}

/// 8 connections charge 1 000 each, 20 times, with max_debt 5 000: the bucket ends at exactly −5 000 (the
/// floor), whatever the interleaving, and a take is then denied with the debt in its `retry_after`.
fn the_floor_holds_under_contention(store: &str) {
    let db = TestDb::new(&format!("charges_floor_{store}"));
    let mut admin = db.connect();
    admin
        .execute(
            "SELECT rate_limit.create_policy('capped', 1, '1 second', burst => 100, max_debt => 5000, store => $1)",
            &[&store],
        )
        .expect("create policy");
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut c = db.connect();
            thread::spawn(move || {
                for _ in 0..20 {
                    c.query_one(
                        "SELECT allowed FROM rate_limit.charge('capped', 'k', 1000)",
                        &[],
                    )
                    .expect("charge");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client");
    }
    let now = tokens(&mut admin, "capped", "k");
    assert!((-5000.0..-4990.0).contains(&now), "{now} tokens");
    let retry: f64 = admin
        .query_one(
            "SELECT extract(epoch FROM retry_after)::float8 FROM rate_limit.take('capped', 'k')",
            &[],
        )
        .expect("take")
        .get(0);
    assert!((4990.0..=5001.0).contains(&retry), "retry_after {retry} s");
}

#[test]
fn the_floor_holds_under_contention_in_the_table_store() {
    the_floor_holds_under_contention("table");
}

#[test]
fn the_floor_holds_under_contention_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    the_floor_holds_under_contention("memory");
}

/// In the table store a charge is part of the transaction: rolled back, it never happened; in a read-only
/// transaction it is refused with 25006, like any write.
#[test]
fn a_rolled_back_charge_is_undone_in_the_table_store() {
    let db = TestDb::new("charges_rollback");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT rate_limit.create_policy('tx', 1, '1 day', burst => 10, max_debt => 10)",
    )
    .expect("create policy");
    c.batch_execute("BEGIN; SELECT rate_limit.charge('tx', 'k', 15); ROLLBACK;")
        .expect("charge and roll back");
    assert_eq!(rate_limit_integration::remaining(&mut c, "tx", "k"), 10);
    let e = c
        .batch_execute("BEGIN READ ONLY; SELECT rate_limit.charge('tx', 'k', 1); COMMIT;")
        .expect_err("a charge writes");
    assert_eq!(
        e.code(),
        Some(&postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );
}
