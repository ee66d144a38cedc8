//! Concurrency leases against a real server, in both stores:
//! - 32 connections acquire and release leases of one key (a policy of 5), each holding its lease a few
//!   milliseconds: from a log of every grant and release (client instants, inside the server's own
//!   intervals), never more than 5 leases are held at once, and the leases all come back; then all 32 ask
//!   at once, each keeping what it got until all have asked: exactly 5 are granted;
//! - leases nobody releases (crashed clients) expire: denied while held, granted again once their TTL has
//!   passed, and the denial's `retry_after` says when;
//! - table store: a lease acquired in a transaction that rolls back is released, and a transaction holding a
//!   lease open makes neither another connection's acquire nor a release of another lease wait.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::GenericClient;
use rate_limit_integration::{compiled_only, edition, stores, Edition, TestDb};

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
        granted > N * 4,
        "{store}: leases were taken and given back ({granted})"
    );
    let remaining: i64 = admin
        .query_one("SELECT remaining FROM rate_limit.acquire('jobs', 'k')", &[])
        .expect("acquire")
        .get(0);
    assert_eq!(remaining, N - 1, "{store}: every lease came back");
    all_connections_at_once_fill_exactly_n(&db, store);
}

/// Every connection asks for one lease at the same instant and keeps what it got until all have asked:
/// exactly N are granted. This is the "the leases can all be filled" half of the test above, which cannot
/// come from its log: a log written by the clients sees a lease from the grant's reply to the release's
/// request, shorter than the server holds it, so how many overlap there depends on the scheduler.
fn all_connections_at_once_fill_exactly_n(db: &TestDb, store: &str) {
    let policy = "fill";
    db.connect()
        .execute(
            "SELECT rate_limit.create_policy($1, $2, '1 minute', algorithm => 'concurrency', store => $3)",
            &[&policy, &N, &store],
        )
        .expect("policy");
    let asked = Arc::new(Barrier::new(CONNECTIONS));
    let handles: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let mut c = db.connect();
            let asked = asked.clone();
            thread::spawn(move || {
                let lease = acquire(&mut c, policy, "k");
                asked.wait();
                if let Some(lease) = lease {
                    assert!(
                        release(&mut c, policy, "k", lease),
                        "a held lease is released once"
                    );
                }
                lease.is_some()
            })
        })
        .collect();
    let granted = handles
        .into_iter()
        .map(|h| h.join().expect("client"))
        .filter(|&granted| granted)
        .count();
    assert_eq!(
        granted as i64, N,
        "{store}: {CONNECTIONS} connections asking at once hold exactly the {N} leases"
    );
}

#[test]
fn never_more_than_n_leases_are_held_in_the_table_store() {
    never_more_than_n_held("table");
}

#[test]
fn never_more_than_n_leases_are_held_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
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
    if compiled_only("the memory store") {
        return;
    }
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

/// No role can squat a key's leases through advisory locks: a role with only LOGIN holds, for the whole
/// test, the advisory locks on `hashtextextended(policy || chr(31) || slot || chr(31) || key, 7)` of both
/// slots of a victim's key (the hash the table store used to create a slot's row under); the victim still gets both leases at once (before: every acquire was denied while the
/// squatter's session lived, and nothing showed in `rate_limit.buckets`). The table store's slot locks
/// live in a lock namespace no SQL function reaches.
#[test]
fn advisory_locks_cannot_squat_a_keys_leases() {
    let db = TestDb::new("lease_squat");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('lease_t2', 2, '3 seconds', algorithm => 'concurrency', store => 'table')",
        )
        .expect("set up");
    let mut squatter = db.connect_as_login_role("rl_squatter");
    squatter
        .batch_execute(
            "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended(\
                 'lease_t2' || chr(31) || s || chr(31) || 'victim2', 7)) \
             FROM generate_series(0, 1) s",
        )
        .expect("the squatter's advisory locks");
    let held: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())",
            &[],
        )
        .expect("locks")
        .get(0);
    assert_eq!(held, 2, "the squatter holds its advisory locks");
    let mut victim = db.connect();
    let mut tx = victim.transaction().expect("begin");
    assert!(
        acquire(&mut tx, "lease_t2", "victim2").is_some(),
        "the first lease"
    );
    assert!(
        acquire(&mut tx, "lease_t2", "victim2").is_some(),
        "the second lease"
    );
    assert!(
        acquire(&mut tx, "lease_t2", "victim2").is_none(),
        "only two"
    );
    tx.commit().expect("commit");
    drop(squatter);
}

/// The table store keeps a lease in its holder's transaction (the choice docs/semantics.md and
/// docs/security.md state): a ROLLBACK frees it at once, and a transaction left open holds it past `per`
/// until it ends, since no other transaction may change its row before then; once committed, it expires
/// `per` after its acquire. The memory store frees it after `per` whatever the holder does.
#[test]
fn a_table_store_lease_lasts_until_per_or_its_transaction_ends() {
    let db = TestDb::new("lease_tx_bound");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('one_t', 1, '1 second', algorithm => 'concurrency', store => 'table');
             SELECT rate_limit.create_policy('one_m', 1, '1 second', algorithm => 'concurrency', store => 'memory');",
        )
        .expect("policies");
    let mut holder = db.connect();
    let mut other = db.connect();
    let cases: &[(&str, bool)] = match edition() {
        Edition::Compiled => &[("one_t", true), ("one_m", false)],
        Edition::Portable => &[("one_t", true)],
    };
    for &(policy, transactional) in cases {
        let mut tx = holder.transaction().expect("begin");
        let acquired = Instant::now();
        assert!(acquire(&mut tx, policy, "k").is_some(), "{policy}");
        assert!(acquire(&mut other, policy, "k").is_none(), "{policy}: held");
        thread::sleep(Duration::from_millis(1500).saturating_sub(acquired.elapsed()));
        assert_eq!(
            acquire(&mut other, policy, "k").is_none(),
            transactional,
            "{policy}: 1.5 s after its acquire, in a transaction still open"
        );
        tx.rollback().expect("rollback");
        if transactional {
            let lease = acquire(&mut other, policy, "k").expect("freed by the rollback at once");
            // committed: it expires per after its acquire
            let acquired = Instant::now();
            assert!(acquire(&mut admin, policy, "k").is_none(), "held");
            thread::sleep(Duration::from_millis(1100).saturating_sub(acquired.elapsed()));
            assert!(
                acquire(&mut admin, policy, "k").is_some(),
                "expired after per"
            );
            assert!(
                !release(&mut other, policy, "k", lease),
                "an expired lease is gone"
            );
        }
    }
}

/// No deadlock, and no wait, between two transactions acquiring and releasing leases of one key (table
/// store), in every interleaving: an acquire only tries its locks (SKIP LOCKED rows, tried slot locks), and
/// a release locks the one slot its lease names. The policy allows 2 leases; each transaction takes 2 and
/// gives back what it got, so at most 2 are granted at once and every step answers.
#[test]
fn acquires_and_releases_never_deadlock() {
    let db = TestDb::new("lease_interleavings");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('il', 2, '1 hour', algorithm => 'concurrency', store => 'table');
             CREATE TABLE got (who text, lease bigint);",
        )
        .expect("policy");
    let script = |who: &'static str| {
        [
            format!("BEGIN; INSERT INTO got SELECT '{who}', lease FROM rate_limit.acquire('il', '{{key}}') WHERE allowed"),
            format!("INSERT INTO got SELECT '{who}', lease FROM rate_limit.acquire('il', '{{key}}') WHERE allowed"),
            format!("SELECT rate_limit.release('il', '{{key}}', lease) FROM got WHERE who = '{who}'"),
            "COMMIT".to_string(),
        ]
    };
    let (a, b) = (script("a"), script("b"));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let runs = rate_limit_integration::interleavings(
        || db.connect(),
        [&a, &b],
        |c, _| {
            c.batch_execute("TRUNCATE got").expect("truncate");
        },
    );
    rate_limit_integration::assert_every_interleaving_answers(&runs, 70, "leases");
}

/// Lease ids come from a random stream per backend, seeded in each backend: twenty backends acquiring the
/// same numbered slot of twenty keys get twenty different ids (a stream seeded before the backends forked
/// would give them all the same), and a lease of one backend is released by another with its id.
#[test]
fn every_backend_draws_its_own_lease_ids() {
    let db = TestDb::new("lease_ids");
    db.connect()
        .batch_execute(&format!(
            "SELECT rate_limit.create_policy('ids', 1, '1 hour', algorithm => 'concurrency', \
                 store => '{}')",
            stores().last().expect("a store")
        ))
        .expect("policy");
    let mut ids = std::collections::HashSet::new();
    let mut held = Vec::new();
    for i in 0..20 {
        let mut c = db.connect();
        let key = format!("k{i}");
        let lease = acquire(&mut c, "ids", &key).expect("the only lease of a fresh key");
        assert!(ids.insert(lease), "lease id {lease} drawn twice");
        held.push((key, lease));
    }
    let mut other = db.connect();
    for (key, lease) in held {
        assert!(release(&mut other, "ids", &key, lease), "{key}");
    }
}
