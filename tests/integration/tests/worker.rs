//! The background worker: with `rate_limit.purge_interval = 1s` (set with ALTER SYSTEM, reset at the end),
//! 100 000 idle full buckets of the table store and 20 000 of the memory store disappear without any call
//! of purge(), while another connection keeps calling (every call answered, exactly the burst granted,
//! its bucket kept); the launcher is in pg_stat_activity.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
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

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).expect(sql).get(0)
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
         SELECT rate_limit.create_policy('busy', 500, '1000 days');",
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

    let guard = PurgeEverySecond(db.connect());
    let mut admin = db.connect();
    admin
        .batch_execute("ALTER SYSTEM SET rate_limit.purge_interval = '1s'")
        .expect("purge every second");
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .expect("reload");
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
