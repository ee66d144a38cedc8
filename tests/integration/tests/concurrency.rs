//! Concurrency against a real server: many client connections, one hot key, every isolation level.
//!
//! Properties checked:
//! - exactness (see `flood`): a new bucket grants exactly its capacity; over a flood from 16 connections,
//!   granted + left = tokens at the start + rate × elapsed: no token granted twice, none lost, whatever the
//!   interleaving; 40001 is retried;
//! - creation races: sessions creating the same new id at once never see unique_violation (23505); each
//!   takes a distinct token; REPEATABLE READ / SERIALIZABLE surface 40001, which the client retries;
//! - many keys: 16 connections each take once from every one of 1 000 new keys, in orders that cross, and
//!   each key grants exactly its burst.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::IsolationLevel;
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

/// One `rate_limit.take(policy, key)` in its own transaction at `level`, retried on 40001 until it commits.
fn take_in_transaction(
    client: &mut postgres::Client,
    level: IsolationLevel,
    policy: &str,
    key: &str,
) -> bool {
    loop {
        let result = (|| {
            let mut tx = client.build_transaction().isolation_level(level).start()?;
            let allowed: bool = tx
                .query_one(
                    "SELECT allowed FROM rate_limit.take($1, $2)",
                    &[&policy, &key],
                )?
                .get(0);
            tx.commit()?;
            Ok::<bool, postgres::Error>(allowed)
        })();
        match result {
            Ok(allowed) => return allowed,
            Err(e) if e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE) => continue,
            Err(e) => panic!("unexpected error at {level:?}: {e:?}"),
        }
    }
}

/// 16 connections take once from each of 1 000 new keys of a policy of burst 5 that refills 5 a day (no
/// token comes back within the test), half of them walking the keys forward and half backward from
/// different starts, so connections meet on keys both while a key's row is created and once it exists.
/// Every key grants exactly 5 of its 16 calls, in every isolation level.
#[test]
fn a_thousand_keys_grant_exactly_their_burst_in_every_isolation_level() {
    const KEYS: usize = 1000;
    const BURST: usize = 5;
    let db = Arc::new(TestDb::new("thousand_keys"));
    db.connect()
        .batch_execute("SELECT rate_limit.create_policy('daily', 5, '1 day', 5)")
        .expect("policy");
    for level in ISOLATION_LEVELS {
        let start = Arc::new(Barrier::new(CONNECTIONS));
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|n| {
                let (db, start) = (Arc::clone(&db), start.clone());
                thread::spawn(move || {
                    let mut client = db.connect();
                    let mut granted = vec![0usize; KEYS];
                    start.wait();
                    for i in 0..KEYS {
                        let step = if n % 2 == 0 { i } else { KEYS - i };
                        let k = (n * 61 + step) % KEYS;
                        let key = format!("{level:?}_{k}");
                        granted[k] +=
                            usize::from(take_in_transaction(&mut client, level, "daily", &key));
                    }
                    granted
                })
            })
            .collect();
        let mut total = vec![0usize; KEYS];
        for w in workers {
            for (k, g) in w.join().expect("worker").into_iter().enumerate() {
                total[k] += g;
            }
        }
        let wrong: Vec<(usize, usize)> = total
            .iter()
            .enumerate()
            .filter(|(_, &g)| g != BURST)
            .map(|(k, &g)| (k, g))
            .collect();
        assert!(
            wrong.is_empty(),
            "{level:?}: keys granted other than {BURST} times: {wrong:?}"
        );
    }
}
