//! `rate_limit.take_batch` against a real server, in both stores:
//! - 16 connections each send batches over the same keys, every batch in its own shuffled order with keys
//!   named twice: each key grants exactly its burst over all of them (no token granted twice, none lost),
//!   and no two batches deadlock (the table store takes a batch's keys in key order);
//! - 16 connections send all-or-nothing batches of overlapping keys: each batch is granted whole or not at
//!   all, and each key grants exactly its burst;
//! - a long batch ends at `statement_timeout` (57014) long before it would have finished.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use rate_limit_integration::{compiled_only, TestDb};

const CONNECTIONS: usize = 16;
/// Each key's burst; the policy refills one token an hour, nothing within a test.
const BURST: i64 = 40;
const KEYS: usize = 50;
const ROUNDS: usize = 5;

/// A permutation of `0..n` from a seed (a small LCG: the test needs varied orders, not randomness).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, (state >> 33) as usize % (i + 1));
    }
    order
}

fn policy(c: &mut Client, name: &str, store: &str) {
    c.execute(
        "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => $2::int, store => $3)",
        &[&name, &(BURST as i32), &store],
    )
    .expect("policy");
}

/// What a batch granted: (key, allowed) per row, in the order of its rows.
fn batch(c: &mut Client, sql: &str, policy: &str, keys: &[String]) -> Vec<(String, bool)> {
    let rows = c.query(sql, &[&policy, &keys]).expect("take_batch");
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            assert_eq!(r.get::<_, i32>(0), i as i32 + 1, "rows in the order given");
            (r.get(1), r.get(2))
        })
        .collect()
}

/// Grants of every key over all connections, and a check that each key is left empty.
fn assert_each_key_granted_its_burst(
    c: &mut Client,
    policy: &str,
    keys: &[String],
    grants: &[Vec<(String, bool)>],
) {
    for key in keys {
        let granted = grants
            .iter()
            .flatten()
            .filter(|(k, allowed)| k == key && *allowed)
            .count() as i64;
        assert_eq!(granted, BURST, "{policy}: key {key} granted");
        let left: i64 = c
            .query_one(
                "SELECT remaining FROM rate_limit.peek($1, $2)",
                &[&policy, key],
            )
            .expect("peek")
            .get(0);
        assert_eq!(left, 0, "{policy}: key {key} left");
    }
}

/// Runs `each(connection index, client)` on [`CONNECTIONS`] connections started together; their results.
fn on_every_connection<T: Send + 'static>(
    db: &Arc<TestDb>,
    store: &str,
    each: impl Fn(usize, &mut Client) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let start = Arc::new(Barrier::new(CONNECTIONS));
    let each = Arc::new(each);
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|n| {
            let (db, start, each, store) = (
                Arc::clone(db),
                start.clone(),
                Arc::clone(&each),
                store.to_string(),
            );
            thread::spawn(move || {
                let mut c = db.connect();
                c.batch_execute(&format!("SET rate_limit.store = '{store}'"))
                    .expect("store");
                start.wait();
                each(n, &mut c)
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|w| w.join().expect("a batch caller"))
        .collect()
}

fn concurrent_batches_grant_each_keys_burst(store: &str) {
    let db = Arc::new(TestDb::new(&format!("batch_{store}")));
    let mut c = db.connect();
    let name = format!("batch_{store}");
    policy(&mut c, &name, store);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    let (policy_name, all_keys) = (name.clone(), keys.clone());
    let grants = on_every_connection(&db, store, move |n, c| {
        let mut got = Vec::new();
        for round in 0..ROUNDS {
            // every key, shuffled, and the first five again: 55 rows per batch
            let order = shuffled(KEYS, (n * ROUNDS + round) as u64);
            let mut sent: Vec<String> = order.iter().map(|&i| all_keys[i].clone()).collect();
            sent.extend(order.iter().take(5).map(|&i| all_keys[i].clone()));
            let rows = batch(
                c,
                "SELECT ordinality, key, allowed FROM rate_limit.take_batch($1, $2)",
                &policy_name,
                &sent,
            );
            let keys_back: Vec<&String> = rows.iter().map(|(k, _)| k).collect();
            assert_eq!(keys_back, sent.iter().collect::<Vec<_>>());
            got.extend(rows);
        }
        got
    });
    // 16 connections × 5 rounds × (1 + 1/10) calls per key: far more than a burst
    assert_each_key_granted_its_burst(&mut c, &name, &keys, &grants);
}

#[test]
fn sixteen_concurrent_batches_grant_each_key_exactly_its_burst_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    concurrent_batches_grant_each_keys_burst("memory");
}

#[test]
fn sixteen_concurrent_batches_grant_each_key_exactly_its_burst_in_the_table_store() {
    concurrent_batches_grant_each_keys_burst("table");
}

fn concurrent_all_or_nothing_batches(store: &str) {
    let db = Arc::new(TestDb::new(&format!("batch_all_{store}")));
    let mut c = db.connect();
    let name = format!("batch_all_{store}");
    policy(&mut c, &name, store);
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let (policy_name, all_keys) = (name.clone(), keys.clone());
    let grants = on_every_connection(&db, store, move |n, c| {
        let mut got = Vec::new();
        for round in 0..ROUNDS * 4 {
            // four of the eight keys, a different four and order each time
            let order = shuffled(8, (n * ROUNDS * 4 + round) as u64);
            let sent: Vec<String> = order.iter().take(4).map(|&i| all_keys[i].clone()).collect();
            let rows = batch(
                c,
                "SELECT ordinality, key, allowed FROM rate_limit.take_batch($1, $2, NULL, true)",
                &policy_name,
                &sent,
            );
            let granted = rows.iter().filter(|(_, allowed)| *allowed).count();
            assert!(
                granted == 0 || granted == rows.len(),
                "an all-or-nothing batch granted {granted} of {}",
                rows.len()
            );
            got.extend(rows);
        }
        got
    });
    // 16 × 20 batches of 4 keys: 40 calls per key on average, so some keys drain; a batch is denied as
    // soon as one of its keys is empty, so the others may keep tokens: each key granted at most its burst,
    // and granted + left = burst exactly
    for key in &keys {
        let granted = grants
            .iter()
            .flatten()
            .filter(|(k, allowed)| k == key && *allowed)
            .count() as i64;
        let left: i64 = c
            .query_one(
                "SELECT remaining FROM rate_limit.peek($1, $2)",
                &[&name, key],
            )
            .expect("peek")
            .get(0);
        assert_eq!(
            granted + left,
            BURST,
            "{name}: key {key}: granted {granted}, left {left}"
        );
    }
}

#[test]
fn concurrent_all_or_nothing_batches_grant_whole_batches_and_conserve_tokens_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    concurrent_all_or_nothing_batches("memory");
}

#[test]
fn concurrent_all_or_nothing_batches_grant_whole_batches_and_conserve_tokens_in_the_table_store() {
    concurrent_all_or_nothing_batches("table");
}

/// A batch checks for a cancel between keys: `statement_timeout` ends a batch of a million keys in the
/// table store (tens of seconds of work) at once, with 57014, and it takes nothing (its transaction
/// rolls back).
#[test]
fn a_long_batch_ends_at_statement_timeout() {
    let db = TestDb::new("batch_timeout");
    let mut c = db.connect();
    policy(&mut c, "long", "table");
    c.batch_execute("SET statement_timeout = '200ms'")
        .expect("timeout");
    let started = Instant::now();
    let e = c
        .query(
            "SELECT count(*) FROM rate_limit.take_batch('long', \
             (SELECT array_agg('k' || i) FROM generate_series(1, 1000000) i))",
            &[],
        )
        .expect_err("cancelled");
    let took = started.elapsed();
    assert_eq!(e.code(), Some(&SqlState::QUERY_CANCELED), "{e:?}");
    assert!(
        took < Duration::from_secs(10),
        "the batch ran on after its timeout: {took:?}"
    );
    c.batch_execute("RESET statement_timeout").expect("reset");
    let rows: i64 = c
        .query_one(
            "SELECT count(*) FROM rate_limit.buckets WHERE policy = 'long'",
            &[],
        )
        .expect("buckets")
        .get(0);
    assert_eq!(rows, 0, "a cancelled batch takes nothing");
}
