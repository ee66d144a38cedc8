//! Concurrency against a real server: many client connections, one hot key, every isolation level.
//!
//! Properties checked:
//! - exactness: a new bucket grants exactly its capacity; then, over a flood, the calls granted plus the
//!   tokens left equal the tokens at the start plus rate × elapsed (within 2% or 2 tokens), and grants never
//!   exceed it: no token is granted twice and none is lost, whatever the interleaving;
//! - creation races: sessions creating the same new id at once never see unique_violation (23505); each
//!   takes a distinct token; REPEATABLE READ / SERIALIZABLE surface 40001, which the client retries.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use rate_limit_integration::{request_in_transaction, TestDb, ISOLATION_LEVELS};

const CONNECTIONS: usize = 16;

/// The exact tokens in bucket `id` (to the millionth) and the server time they were read at, in seconds.
fn tokens_now(client: &mut Client, id: &str) -> (f64, f64) {
    let row = client
        .query_one(
            "SELECT tokens::float8, extract(epoch FROM clock_timestamp())::float8 \
             FROM rate_limit.buckets WHERE id = $1",
            &[&id],
        )
        .expect("read the bucket");
    (row.get(0), row.get(1))
}

#[test]
fn hot_key_grants_exactly_capacity_plus_refill_in_every_isolation_level() {
    let db = Arc::new(TestDb::new("hot_key"));
    let (rate, window) = (50, 4);
    for level in ISOLATION_LEVELS {
        let id = format!("hot_{level:?}");
        let granted = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let retries = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(CONNECTIONS + 1));
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let (db, id) = (Arc::clone(&db), id.clone());
                let (granted, calls, retries) = (granted.clone(), calls.clone(), retries.clone());
                let (stop, start) = (stop.clone(), start.clone());
                thread::spawn(move || {
                    let mut client = db.connect();
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let c = request_in_transaction(&mut client, level, &id, rate, window);
                        calls.fetch_add(1, Ordering::Relaxed);
                        retries.fetch_add(u64::from(c.retries), Ordering::Relaxed);
                        if c.remaining >= 0 {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        // A new bucket is full: one statement drains it, and exactly its capacity is granted. The flood then
        // starts from an empty bucket whose exact content is known, and it never refills to the cap, where
        // refill is (rightly) wasted and conservation would not hold.
        let mut clock = db.connect();
        let drained: i64 = clock
            .query_one(
                "SELECT count(*) FILTER (WHERE rate_limiting_request($1, $2::int, $3::int) >= 0) \
                 FROM generate_series(1, $2::int * $3::int + 50)",
                &[&id, &rate, &window],
            )
            .expect("drain the bucket")
            .get(0);
        let capacity = i64::from(rate * window);
        assert!(
            drained == capacity || drained == capacity + 1,
            "{level:?}: a new bucket granted {drained} calls in a row, capacity is {capacity}"
        );
        let (at_start, t0) = tokens_now(&mut clock, &id);
        start.wait();
        thread::sleep(Duration::from_secs(4));
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().expect("worker thread");
        }
        let (left, t1) = tokens_now(&mut clock, &id);
        let granted = granted.load(Ordering::Relaxed) as f64;
        let calls = calls.load(Ordering::Relaxed) as f64;
        let expected = at_start + f64::from(rate) * (t1 - t0);
        let tolerance = (expected * 0.02).max(2.0);
        eprintln!(
            "{level:?}: {calls} calls, {granted} granted, {left:.3} left, expected {expected:.1}, {} retries",
            retries.load(Ordering::Relaxed)
        );
        assert!(
            granted <= expected.floor(),
            "{level:?}: granted {granted} > tokens at start + rate x elapsed = {expected:.2}"
        );
        // conservation: every token that ever entered the bucket was either granted once or is still there
        assert!(
            (granted + left - expected).abs() <= tolerance,
            "{level:?}: granted {granted} + left {left:.3}, expected {expected:.1} ± {tolerance:.1}"
        );
        // and the flood drained it: what is left is a small part of what was granted
        assert!(
            left <= tolerance,
            "{level:?}: {left:.3} tokens left: the flood did not keep the bucket drained"
        );
        assert!(
            calls > granted * 1.5,
            "{level:?}: the key was not flooded ({calls} calls)"
        );
    }
}

#[test]
fn sessions_creating_the_same_new_id_never_collide() {
    let db = Arc::new(TestDb::new("creation_race"));
    let (rate, window) = (1, 1000);
    let rounds = 15;
    for level in ISOLATION_LEVELS {
        let start = Arc::new(Barrier::new(CONNECTIONS));
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let (db, start) = (Arc::clone(&db), start.clone());
                thread::spawn(move || {
                    let mut client = db.connect();
                    (0..rounds)
                        .map(|round| {
                            start.wait();
                            let began = Instant::now();
                            let id = format!("new_{level:?}_{round}");
                            let c = request_in_transaction(&mut client, level, &id, rate, window);
                            (c.remaining, c.retries, began.elapsed())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<Vec<(i32, u32, Duration)>> = workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect();
        for round in 0..rounds {
            let mut remaining: Vec<i32> = results.iter().map(|r| r[round].0).collect();
            remaining.sort_unstable();
            // Each caller took one token of a 1000-token bucket. Refill is 1 token/s, so a round that lasted
            // s seconds (retries make SERIALIZABLE rounds slow) may see up to floor(s) tokens come back.
            let slowest = results.iter().map(|r| r[round].2).max().unwrap_or_default();
            let refill = slowest.as_secs() as i32;
            let lowest_possible = 1000 - CONNECTIONS as i32;
            assert!(
                remaining[0] >= lowest_possible && remaining[0] <= lowest_possible + refill,
                "{level:?} round {round}: lowest remaining {} but {CONNECTIONS} callers took a token each \
                 and at most {refill} came back in {slowest:?}: {remaining:?}",
                remaining[0]
            );
            if refill == 0 {
                let expected: Vec<i32> = (lowest_possible..1000).collect();
                assert_eq!(
                    remaining, expected,
                    "{level:?} round {round}: every caller takes a distinct token"
                );
            }
        }
        let retries: u32 = results.iter().flatten().map(|r| r.1).sum();
        eprintln!("{level:?}: {retries} serialization retries over {rounds} rounds");
    }
}
