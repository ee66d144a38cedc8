//! Concurrency against a real server: many client connections, one hot key, every isolation level.
//!
//! Properties checked:
//! - exactness: the calls granted over a flood equal capacity + rate × elapsed (within 2% or 2 tokens), and
//!   never exceed it: no token is granted twice and none is lost, whatever the interleaving;
//! - creation races: sessions creating the same new id at once never see unique_violation (23505); each
//!   takes a distinct token; REPEATABLE READ / SERIALIZABLE surface 40001, which the client retries.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use rate_limit_integration::{request_in_transaction, server_now, TestDb, ISOLATION_LEVELS};

const CONNECTIONS: usize = 16;

#[test]
fn hot_key_grants_exactly_capacity_plus_refill_in_every_isolation_level() {
    let db = Arc::new(TestDb::new("hot_key"));
    let (rate, window) = (100, 2);
    let capacity = f64::from(rate * window);
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
        let mut clock = db.connect();
        let t0 = server_now(&mut clock);
        start.wait();
        thread::sleep(Duration::from_secs(4));
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().expect("worker thread");
        }
        let t1 = server_now(&mut clock);
        let granted = granted.load(Ordering::Relaxed) as f64;
        let calls = calls.load(Ordering::Relaxed) as f64;
        let expected = capacity + f64::from(rate) * (t1 - t0);
        let tolerance = (expected * 0.02).max(2.0);
        eprintln!(
            "{level:?}: {calls} calls, {granted} granted, expected {expected:.1}, {} retries",
            retries.load(Ordering::Relaxed)
        );
        assert!(
            granted <= expected.floor(),
            "{level:?}: granted {granted} > capacity + rate x elapsed = {expected:.2}"
        );
        assert!(
            (granted - expected).abs() <= tolerance,
            "{level:?}: granted {granted}, expected {expected:.1} ± {tolerance:.1}"
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
                            let id = format!("new_{level:?}_{round}");
                            request_in_transaction(&mut client, level, &id, rate, window)
                        })
                        .map(|c| (c.remaining, c.retries))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<Vec<(i32, u32)>> = workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect();
        for round in 0..rounds {
            let mut remaining: Vec<i32> = results.iter().map(|r| r[round].0).collect();
            remaining.sort_unstable();
            let expected: Vec<i32> = (1000 - CONNECTIONS as i32..1000).collect();
            assert_eq!(
                remaining, expected,
                "{level:?} round {round}: every caller takes a distinct token"
            );
        }
        let retries: u32 = results.iter().flatten().map(|r| r.1).sum();
        eprintln!("{level:?}: {retries} serialization retries over {rounds} rounds");
    }
}
