//! Concurrency leases against a real server, in both stores:
//! - 32 connections acquire and release leases of one key (a policy of 5), each holding its lease a few
//!   milliseconds: from a log of every grant and release (client instants, inside the server's own
//!   intervals), never more than 5 leases are held at once, and the leases all come back;
//! - leases nobody releases (crashed clients) expire: denied while held, granted again once their TTL has
//!   passed, and the denial's `retry_after` says when;
//! - table store: a lease acquired in a transaction that rolls back is released, and a transaction holding a
//!   lease open makes neither another connection's acquire nor a release of another lease wait.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::GenericClient;
use rate_limit_integration::TestDb;

const N: i64 = 5;
const CONNECTIONS: usize = 32;
const ROUNDS: usize = 25;

fn acquire(c: &mut impl GenericClient, policy: &str, key: &str) -> Option<i64> {
    let row = c
        .query_one(
            "SELECT allowed, lease FROM rate_limit.acquire($1, $2)",
            &[&policy, &key],
        )
        .expect("acquire");
    let (allowed, lease): (bool, Option<i64>) = (row.get(0), row.get(1));
    assert_eq!(
        allowed,
        lease.is_some(),
        "a grant has a lease, a denial none"
    );
    lease
}

fn release(c: &mut impl GenericClient, policy: &str, key: &str, lease: i64) -> bool {
    c.query_one(
        "SELECT rate_limit.release($1, $2, $3)",
        &[&policy, &key, &lease],
    )
    .expect("release")
    .get(0)
}

/// +1 when a lease was granted (after the server granted it), -1 when it is about to be released (before
/// the server frees it): a running sum of the log never exceeds what the server held.
type Log = Arc<Mutex<Vec<(Instant, i64)>>>;

fn never_more_than_n_held(store: &str) {
    let db = TestDb::new(&format!("leases_{store}"));
    let mut admin = db.connect();
    admin
        .execute(
            "SELECT rate_limit.create_policy('jobs', $1, '1 minute', algorithm => 'concurrency', store => $2)",
            &[&N, &store],
        )
        .expect("policy");
    let log: Log = Arc::default();
    let start = Arc::new(Barrier::new(CONNECTIONS));
    let handles: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let mut c = db.connect();
            let (log, start) = (log.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut granted = 0;
                for _ in 0..ROUNDS {
                    let Some(lease) = acquire(&mut c, "jobs", "k") else {
                        continue;
                    };
                    log.lock().expect("log").push((Instant::now(), 1));
                    granted += 1;
                    thread::sleep(Duration::from_millis(3));
                    log.lock().expect("log").push((Instant::now(), -1));
                    assert!(
                        release(&mut c, "jobs", "k", lease),
                        "a held lease is released once"
                    );
                }
                granted
            })
        })
        .collect();
    let granted: i64 = handles.into_iter().map(|h| h.join().expect("client")).sum();
    let mut log = log.lock().expect("log").clone();
    log.sort_by_key(|&(at, delta)| (at, delta));
    let (mut held, mut most) = (0, 0);
    for (_, delta) in log {
        held += delta;
        most = most.max(held);
    }
    assert!(
        most <= N,
        "{store}: {most} leases held at once, the policy allows {N}"
    );
    assert!(
        most == N,
        "{store}: 32 connections should fill the 5 leases ({most})"
    );
    assert!(
        granted > N * 4,
        "{store}: leases were taken and given back ({granted})"
    );
    let remaining: i64 = admin
        .query_one("SELECT remaining FROM rate_limit.acquire('jobs', 'k')", &[])
        .expect("acquire")
        .get(0);
    assert_eq!(remaining, N - 1, "{store}: every lease came back");
}

#[test]
fn never_more_than_n_leases_are_held_in_the_table_store() {
    never_more_than_n_held("table");
}

#[test]
fn never_more_than_n_leases_are_held_in_the_memory_store() {
    never_more_than_n_held("memory");
}

/// Two leases of 1 s that nobody releases: denied until the first expires, then granted.
fn expired_leases_are_reclaimed(store: &str) {
    let db = TestDb::new(&format!("lease_ttl_{store}"));
    let mut c = db.connect();
    c.execute(
        "SELECT rate_limit.create_policy('short', 2, '1 second', algorithm => 'concurrency', store => $1)",
        &[&store],
    )
    .expect("policy");
    let acquired = Instant::now();
    assert!(acquire(&mut c, "short", "k").is_some());
    assert!(acquire(&mut c, "short", "k").is_some());
    let row = c
        .query_one(
            "SELECT allowed, extract(epoch FROM retry_after)::float8 FROM rate_limit.acquire('short', 'k')",
            &[],
        )
        .expect("acquire");
    let (allowed, retry): (bool, f64) = (row.get(0), row.get(1));
    assert!(!allowed, "{store}: both leases held");
    assert!(
        retry > 0.0 && retry <= 1.0,
        "{store}: retry_after {retry} s is within the TTL"
    );
    thread::sleep(Duration::from_secs_f64(retry + 0.05));
    assert!(
        acquire(&mut c, "short", "k").is_some(),
        "{store}: an expired lease is reclaimed {:?} after it was acquired",
        acquired.elapsed()
    );
}

#[test]
fn expired_leases_are_reclaimed_in_the_table_store() {
    expired_leases_are_reclaimed("table");
}

#[test]
fn expired_leases_are_reclaimed_in_the_memory_store() {
    expired_leases_are_reclaimed("memory");
}

#[test]
fn a_rolled_back_lease_is_released_and_an_open_one_makes_nobody_wait() {
    let db = TestDb::new("lease_rollback");
    let mut a = db.connect();
    a.execute(
        "SELECT rate_limit.create_policy('tx', 2, '1 hour', algorithm => 'concurrency', store => 'table')",
        &[],
    )
    .expect("policy");
    // rolled back: released
    let mut tx = a.transaction().expect("begin");
    assert!(acquire(&mut tx, "tx", "k").is_some());
    tx.rollback().expect("rollback");
    // an open transaction holds one lease (its row stays locked until it ends) ...
    let mut tx = a.transaction().expect("begin");
    assert!(acquire(&mut tx, "tx", "k").is_some());
    // ... another connection gets the other one at once, then is denied at once, without waiting
    let mut b = db.connect();
    b.batch_execute("SET statement_timeout = '2s'")
        .expect("timeout");
    let started = Instant::now();
    assert!(acquire(&mut b, "tx", "k").is_some(), "the second lease");
    assert!(acquire(&mut b, "tx", "k").is_none(), "both held");
    assert!(started.elapsed() < Duration::from_secs(2));
    tx.commit().expect("commit");
    assert!(
        acquire(&mut b, "tx", "k").is_none(),
        "the committed lease is held"
    );
}

/// An open transaction that acquired a lease (and looked at the held slot before it) does not make the
/// release of that other lease wait: only a free slot's row is ever locked by an acquire.
#[test]
fn a_release_never_waits_for_an_open_acquire() {
    let db = TestDb::new("lease_release_waits");
    let mut a = db.connect();
    a.execute(
        "SELECT rate_limit.create_policy('tx2', 2, '1 hour', algorithm => 'concurrency', store => 'table')",
        &[],
    )
    .expect("policy");
    let first = acquire(&mut a, "tx2", "k").expect("the first lease, committed");
    let mut b = db.connect();
    let mut tx = b.transaction().expect("begin");
    assert!(
        acquire(&mut tx, "tx2", "k").is_some(),
        "the second lease, in an open transaction"
    );
    a.batch_execute("SET statement_timeout = '2s'")
        .expect("timeout");
    assert!(release(&mut a, "tx2", "k", first), "released at once");
    tx.commit().expect("commit");
}
