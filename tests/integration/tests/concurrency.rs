//! Concurrency against a real server: many client connections, one hot key, every isolation level.
//!
//! Properties checked:
//! - exactness (see `flood`): a new bucket grants exactly its capacity; over a flood from 16 connections,
//!   granted + left = tokens at the start + rate × elapsed: no token granted twice, none lost, whatever the
//!   interleaving; 40001 is retried;
//! - creation races: sessions creating the same new id at once never see unique_violation (23505); each
//!   takes a distinct token; REPEATABLE READ / SERIALIZABLE surface 40001, which the client retries.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rate_limit_integration::{flood, request_in_transaction, TestDb, ISOLATION_LEVELS};

const CONNECTIONS: usize = 16;

#[test]
fn hot_key_grants_exactly_capacity_plus_refill_in_every_isolation_level() {
    let db = Arc::new(TestDb::new("hot_key"));
    for level in ISOLATION_LEVELS {
        flood(&db, &format!("hot_{level:?}"), CONNECTIONS, level, false);
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
