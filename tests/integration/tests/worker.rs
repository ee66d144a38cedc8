//! The background worker: with `rate_limit.purge_interval = 1s` (set with ALTER SYSTEM, reset at the end),
//! 100 000 idle full buckets of the table store and 20 000 of the memory store disappear without any call
//! of purge(), while another connection keeps calling (every call answered, exactly the burst granted,
//! its bucket kept); the launcher is in pg_stat_activity. A bucket in use is never deleted, even when it
//! is full at each round, and each purge transaction reads a bounded span of rows. A database whose state
//! table is locked by someone else does not stall the worker: its purge gives up after a lock timeout,
//! logged, and is retried. Memory buckets of dropped databases and of dropped policies are freed.

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use rate_limit_integration::purge::{assert_idle_deleted_span_by_span, KeyInUse, RECORD_DELETIONS};
use rate_limit_integration::TestDb;

struct PurgeEverySecond(Client);

impl Drop for PurgeEverySecond {
    fn drop(&mut self) {
        // one statement per call: ALTER SYSTEM cannot run in the transaction of a multi-statement string
        let _ = self
            .0
            .batch_execute("ALTER SYSTEM RESET rate_limit.purge_interval");
        let _ = self.0.batch_execute("SELECT pg_reload_conf()");
    }
}

impl PurgeEverySecond {
    /// Sets `rate_limit.purge_interval = '1s'` for the server; dropping the guard resets it.
    fn start(admin: Client) -> PurgeEverySecond {
        let mut guard = PurgeEverySecond(admin);
        guard.set("1s");
        guard
    }

    /// Sets another interval and reloads the configuration.
    fn set(&mut self, interval: &str) {
        self.0
            .batch_execute(&format!(
                "ALTER SYSTEM SET rate_limit.purge_interval = '{interval}'"
            ))
            .expect("set the purge interval");
        self.0
            .batch_execute("SELECT pg_reload_conf()")
            .expect("reload");
    }
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).expect(sql).get(0)
}

/// Polls `done` every 50 ms for up to `seconds`; panics with `what` if it never holds.
fn wait_for(seconds: u64, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !done() {
        assert!(Instant::now() < deadline, "{what} (waited {seconds} s)");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn idle_full_buckets_are_purged_while_calls_continue() {
    let db = TestDb::new("worker_purge");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT count(*) FROM generate_series(1, 100000) AS g WHERE rate_limiting_request('idle' || g, 1000, 1) >= 0;
         SET rate_limit.store = 'memory';
         SELECT count(*) FROM generate_series(1, 20000) AS g WHERE rate_limiting_request('idle' || g, 1000, 1) >= 0;
         RESET rate_limit.store;
         SELECT rate_limit.create_policy('busy', 500, '400 days');",
    )
    .expect("idle buckets");
    assert_eq!(
        count(&mut c, "SELECT count(*) FROM rate_limit.bucket_state"),
        100_000
    );

    let stop = Arc::new(AtomicBool::new(false));
    let caller = {
        let stop = stop.clone();
        let mut c = db.connect();
        thread::spawn(move || {
            let (mut calls, mut granted) = (0i64, 0i64);
            while !stop.load(Ordering::Relaxed) {
                let allowed: bool = c
                    .query_one("SELECT allowed FROM rate_limit.take('busy', 'caller')", &[])
                    .expect("every call is answered during purges")
                    .get(0);
                calls += 1;
                granted += i64::from(allowed);
                thread::sleep(Duration::from_millis(5));
            }
            (calls, granted)
        })
    };

    let guard = PurgeEverySecond::start(db.connect());
    let mut admin = db.connect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut saw_launcher = false;
    loop {
        saw_launcher |= count(
            &mut admin,
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rate_limit launcher'",
        ) == 1;
        let table = count(
            &mut admin,
            "SELECT count(*) FROM rate_limit.bucket_state WHERE key LIKE 'idle%'",
        );
        let memory = count(
            &mut admin,
            "SELECT count(*) FROM rate_limit.buckets WHERE store = 'memory' AND key LIKE 'idle%'",
        );
        if table == 0 && memory == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {table} table and {memory} memory idle buckets after 2 minutes"
        );
        thread::sleep(Duration::from_millis(500));
    }
    drop(guard);
    stop.store(true, Ordering::Relaxed);
    let (calls, granted) = caller.join().expect("caller");
    assert!(saw_launcher, "the launcher shows in pg_stat_activity");
    assert!(calls > 0);
    assert_eq!(
        granted,
        calls.min(500),
        "exactly the burst granted: the busy bucket was never purged"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM rate_limit.bucket_state WHERE namespace = 'busy'"
        ),
        1,
        "a bucket that is not full stays"
    );
}

/// A transaction holds `rate_limit.bucket_state` in ACCESS EXCLUSIVE mode (as VACUUM FULL, CLUSTER or
/// ALTER TABLE would) while purges run every second. The database's purge waits for the lock only up to its
/// lock timeout, then fails with the error in the server's log; the launcher goes on, so the memory store
/// is still purged meanwhile (buckets made after the purge first met the lock disappear). Once the lock is
/// released, a later round purges the table.
/// The finished_at of this database's last table-store purge, in seconds (0 before the first).
fn last_table_purge(c: &mut Client) -> f64 {
    c.query_opt(
        "SELECT date_part('epoch', finished_at) FROM rate_limit.metrics_purge WHERE store = 'table'",
        &[],
    )
    .expect("metrics_purge")
    .map_or(0.0, |r| r.get(0))
}

/// A key called every 20 ms whose bucket refills within a millisecond is full at almost every instant,
/// yet the worker never deletes its row (deleting it would make its next call insert it again, and wait
/// for the worker's transaction first: the bench saw whole rounds of calls twenty times slower while the
/// purge deleted buckets in use); the 3000 idle buckets are deleted, by transactions that each read one
/// span of at most 1000 rows (a caller waits at most that long for a row the worker locked). Deletions are
/// recorded by a trigger, with the deleting transaction.
#[test]
fn a_bucket_in_use_keeps_its_row_and_each_purge_transaction_reads_one_span() {
    let db = TestDb::new("worker_in_use");
    let mut c = db.connect();
    c.batch_execute(RECORD_DELETIONS)
        .expect("the record of deletions");
    c.batch_execute(
        "SELECT rate_limit.create_policy('refills', 1000, '1 second', burst => 1);
         SELECT count(*) FROM generate_series(1, 3000) AS g, LATERAL rate_limit.take('refills', 'idle' || g);",
    )
    .expect("the idle buckets");

    let hot = KeyInUse::start(db.connect(), "refills", "hot");

    let mut admin = db.connect();
    let before = last_table_purge(&mut admin);
    let guard = PurgeEverySecond::start(db.connect());
    wait_for(60, "the idle buckets were not purged", || {
        count(
            &mut admin,
            "SELECT count(*) FROM rate_limit.bucket_state WHERE key LIKE 'idle%'",
        ) == 0
    });
    // two more rounds, each finished after the hot key had been called for over a second
    for _ in 0..2 {
        let seen = last_table_purge(&mut admin).max(before);
        wait_for(30, "no further purge finished", || {
            last_table_purge(&mut admin) > seen
        });
    }
    drop(guard);
    let calls = hot.stop();
    assert!(
        calls > 50,
        "the hot key was called throughout: {calls} calls"
    );

    assert_idle_deleted_span_by_span(&mut admin, 3000);
}

#[test]
fn a_purge_that_cannot_lock_the_table_is_logged_and_retried() {
    let db = TestDb::new("worker_locked");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT count(*) FROM generate_series(1, 1000) AS g WHERE rate_limiting_request('locked' || g, 1000, 1) >= 0",
    )
    .expect("idle table buckets");
    let log: String = c
        .query_one(
            "SELECT current_setting('data_directory') || '/server.log'",
            &[],
        )
        .expect("log path")
        .get(0);
    let log_start = fs::metadata(&log).expect("the server's log").len() as usize;

    let mut holder = db.connect();
    holder
        .batch_execute("BEGIN; LOCK TABLE rate_limit.bucket_state IN ACCESS EXCLUSIVE MODE")
        .expect("lock the state table");
    let guard = PurgeEverySecond::start(db.connect());
    let mut admin = db.connect();
    wait_for(60, "no purge of this database met the lock", || {
        count(
            &mut admin,
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rate_limit purge'
             AND datname = current_database() AND wait_event_type = 'Lock'",
        ) > 0
    });

    let mut memory = db.connect_memory();
    memory
        .batch_execute(
            "SELECT count(*) FROM generate_series(1, 100) AS g WHERE rate_limiting_request('locked_memory' || g, 1000, 1) >= 0",
        )
        .expect("idle memory buckets");
    let idle_in_memory =
        "SELECT count(*) FROM rate_limit.memory_buckets() WHERE key LIKE 'locked_memory%'";
    assert_eq!(count(&mut admin, idle_in_memory), 100);
    wait_for(
        30,
        "the memory store was not purged while one database's state table was locked",
        || count(&mut admin, idle_in_memory) == 0,
    );

    holder.batch_execute("ROLLBACK").expect("release the lock");
    wait_for(
        30,
        "the table was not purged once the lock was released",
        || {
            count(
                &mut admin,
                "SELECT count(*) FROM rate_limit.bucket_state WHERE key LIKE 'locked%'",
            ) == 0
        },
    );
    drop(guard);
    let logged = fs::read(&log).expect("the server's log");
    let logged = String::from_utf8_lossy(&logged[log_start.min(logged.len())..]);
    assert!(
        logged.contains("canceling statement due to lock timeout"),
        "the failed purge is in the server's log"
    );
}

/// Memory buckets of a dropped database are freed by the worker's next round (they could never be called
/// again, and they filled that database's share); and a reload that shortens `rate_limit.purge_interval`
/// applies at once (before, the launcher kept the deadline of the old interval: 300 s here).
#[test]
fn dropped_databases_lose_their_memory_buckets_and_a_shorter_interval_applies_at_once() {
    let mut admin = Client::connect(
        &format!("{} dbname=postgres", rate_limit_integration::conninfo()),
        postgres::NoTls,
    )
    .expect("admin");
    let dropped_buckets = |admin: &mut Client| -> i64 {
        admin
            .query_one(
                "SELECT coalesce(sum(buckets), 0)::bigint FROM rate_limit.memory_shares() \
                 WHERE database IS NULL",
                &[],
            )
            .expect("memory_shares")
            .get(0)
    };
    // memory_shares() needs the extension in the admin's database
    admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS rate_limit")
        .expect("extension in postgres");
    let fill_and_drop = |name: &str| {
        let db = TestDb::new(name);
        db.connect_memory()
            .batch_execute(
                "SELECT count(*) FROM generate_series(1, 500) AS g \
                 WHERE rate_limiting_request('kept' || g, 1, 3600) >= 0",
            )
            .expect("buckets that refill in an hour");
        drop(db);
    };

    // with rounds every second, the dropped database's buckets are freed
    fill_and_drop("dropped_first");
    assert!(dropped_buckets(&mut admin) >= 500);
    let mut guard = PurgeEverySecond::start(admin);
    let mut admin = Client::connect(
        &format!("{} dbname=postgres", rate_limit_integration::conninfo()),
        postgres::NoTls,
    )
    .expect("admin");
    wait_for(30, "the dropped database's buckets were not freed", || {
        dropped_buckets(&mut admin) == 0
    });

    // every 300 s now: the next round is 300 s after the last. A round the 1 s interval had already
    // scheduled is due within 1 s of the last one; 2 s on, it has begun (a round purges memory first).
    guard.set("300s");
    thread::sleep(Duration::from_secs(2));
    fill_and_drop("dropped_second");
    assert!(dropped_buckets(&mut admin) >= 500);
    // a reload to 1 s makes the next round due 1 s after the last one: at once
    guard.set("1s");
    wait_for(
        60,
        "a shorter purge_interval did not apply until the old one ran out",
        || dropped_buckets(&mut admin) == 0,
    );
    drop(guard);
}

/// Memory buckets of a dropped policy are freed once the drop has committed, by `rate_limit.purge()` and
/// by the worker's round, after `drop_policy` and after `TRUNCATE rate_limit.policies`. A drop rolled back
/// or not yet committed frees nothing, and neither does a policy created by a transaction still open
/// (its buckets exist before its row is visible): their limits stay exact.
#[test]
fn dropped_policies_lose_their_memory_buckets_once_the_drop_commits() {
    let db = TestDb::new("worker_dropped_policy");
    let mut owner = db.connect();
    let buckets = |c: &mut Client| rate_limit_integration::memory_usage(c, "database_buckets");
    let take = |c: &mut Client, policy: &str, key: &str| -> i64 {
        c.query_one(
            "SELECT remaining FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .expect("take")
        .get(0)
    };
    owner
        .batch_execute(
            "SELECT rate_limit.create_policy('daily', 1, '1 day', 10, store => 'memory')",
        )
        .expect("create");
    for k in 0..5 {
        assert_eq!(take(&mut owner, "daily", &format!("k{k}")), 9);
    }
    assert_eq!(buckets(&mut owner), 5);

    // rolled back: nothing freed, the limits are intact
    owner
        .batch_execute("BEGIN; SELECT rate_limit.drop_policy('daily'); ROLLBACK")
        .expect("drop rolled back");
    assert_eq!(count(&mut owner, "SELECT rate_limit.purge()"), 0);
    assert_eq!(buckets(&mut owner), 5);
    assert_eq!(take(&mut owner, "daily", "k0"), 8);

    // not committed yet, and a policy created in a transaction still open: a purge frees neither
    let mut other = db.connect();
    other
        .batch_execute(
            "BEGIN; SELECT rate_limit.drop_policy('daily');
             SELECT rate_limit.create_policy('young', 1, '1 day', 10, store => 'memory')",
        )
        .expect("open transaction");
    assert_eq!(take(&mut other, "young", "y"), 9);
    assert_eq!(buckets(&mut owner), 6);
    assert_eq!(count(&mut owner, "SELECT rate_limit.purge()"), 0);
    assert_eq!(buckets(&mut owner), 6);
    other
        .batch_execute(
            "ROLLBACK; SELECT rate_limit.create_policy('young', 1, '1 day', 10, store => 'memory')",
        )
        .expect("rolled back, then created for good");
    assert_eq!(take(&mut owner, "daily", "k0"), 7);

    // committed: purge() frees the dropped policy's buckets, and only those
    owner
        .batch_execute("SELECT rate_limit.drop_policy('daily')")
        .expect("drop");
    assert_eq!(buckets(&mut owner), 6); // the rolled-back incarnation of 'young' is unreachable but held
    assert_eq!(count(&mut owner, "SELECT rate_limit.purge()"), 5);
    assert_eq!(buckets(&mut owner), 1);
    assert_eq!(
        count(
            &mut owner,
            "SELECT count(*) FROM rate_limit.dropped_policies"
        ),
        0, // purge() consumed the record of 'daily'
    );

    // the worker's round, after drop_policy and after TRUNCATE
    owner
        .batch_execute(
            "SELECT rate_limit.create_policy('hourly', 1, '1 hour', 10, store => 'memory')",
        )
        .expect("create");
    for k in 0..3 {
        take(&mut owner, "hourly", &format!("h{k}"));
        take(&mut owner, "young", &format!("y{k}"));
    }
    assert_eq!(buckets(&mut owner), 7);
    let admin = Client::connect(
        &format!("{} dbname=postgres", rate_limit_integration::conninfo()),
        postgres::NoTls,
    )
    .expect("admin");
    let _every_second = PurgeEverySecond::start(admin);
    owner
        .batch_execute("SELECT rate_limit.drop_policy('hourly')")
        .expect("drop");
    wait_for(30, "the worker frees the dropped policy's buckets", || {
        buckets(&mut owner) == 4
    });
    owner
        .batch_execute("TRUNCATE rate_limit.policies")
        .expect("truncate");
    // left: the bucket of the 'young' whose creation rolled back, never a policy, so never dropped; it
    // goes when full (in a day), like any bucket
    wait_for(
        30,
        "the worker frees the truncated policies' buckets",
        || buckets(&mut owner) == 1,
    );
    // the worker frees the buckets in shared memory, then its transaction that deletes the records commits:
    // a moment may pass between the two
    wait_for(
        30,
        "the worker consumes the records of the truncated policies",
        || {
            count(
                &mut owner,
                "SELECT count(*) FROM rate_limit.dropped_policies",
            ) == 0
        },
    );
}
