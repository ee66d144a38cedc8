//! The full limiter API against a real server: multi-limit calls from many connections are all-or-nothing
//! in both stores and never deadlock, `wait` sleeps and can be interrupted, policies survive pg_dump.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use rate_limit_integration::{compiled_only, edition, remaining, stores, Edition, TestDb};

const THREADS: usize = 8;
const CALLS: usize = 150;

/// Policies `a` (burst 40), `b` (burst 25) and `c` (burst 1000), refilling one token every 6 hours, in
/// `store`.
/// Eight connections call `take(['a','b','c'], 'k')` and, in between, `take('b', 'k')` alone. If a
/// multi-limit call ever consumed from some policies and not others, `a` and `c` (which only multi-limit
/// calls touch) would disagree with the number of multi-limit grants counted by the clients.
fn multi_limit_is_all_or_nothing(store: &str) {
    let db = TestDb::new(&format!("multi_{store}"));
    let mut admin = db.connect();
    for (name, burst) in [("a", 40i64), ("b", 25), ("c", 1000)] {
        admin
            .execute(
                "SELECT rate_limit.create_policy($1, 1, '6 hours', $2, store => $3)",
                &[&name, &burst, &store],
            )
            .expect("create policy");
    }
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut client = db.connect();
            thread::spawn(move || {
                let (mut multi, mut single) = (0i64, 0i64);
                for i in 0..CALLS {
                    let row = if (i + t) % 3 == 0 {
                        client.query_one("SELECT allowed FROM rate_limit.take('b', 'k')", &[])
                    } else {
                        client.query_one(
                            "SELECT allowed FROM rate_limit.take_many(ARRAY['a', 'b', 'c'], ARRAY['k'])",
                            &[],
                        )
                    }
                    .expect("take");
                    let allowed: bool = row.get(0);
                    if allowed {
                        if (i + t) % 3 == 0 {
                            single += 1;
                        } else {
                            multi += 1;
                        }
                    }
                }
                (multi, single)
            })
        })
        .collect();
    let (mut multi, mut single) = (0, 0);
    for h in handles {
        let (m, s) = h.join().expect("client thread");
        multi += m;
        single += s;
    }
    assert_eq!(multi + single, 25, "b's 25 tokens all went, and no more");
    assert_eq!(remaining(&mut admin, "a", "k"), 40 - multi);
    assert_eq!(remaining(&mut admin, "c", "k"), 1000 - multi);
    assert_eq!(remaining(&mut admin, "b", "k"), 0);
}

#[test]
fn multi_limit_is_all_or_nothing_in_the_table_store() {
    multi_limit_is_all_or_nothing("table");
}

#[test]
fn multi_limit_is_all_or_nothing_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    multi_limit_is_all_or_nothing("memory");
}

/// Calls naming the same buckets in opposite orders (user then org, org then user) run concurrently
/// without a deadlock: rows are always locked in one global order.
#[test]
fn opposite_orders_never_deadlock() {
    let db = TestDb::new("multi_order");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('user', 1000, '1 second', 100000);
             SELECT rate_limit.create_policy('org', 1000, '1 second', 100000);",
        )
        .expect("create policies");
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut client = db.connect();
            thread::spawn(move || {
                for _ in 0..CALLS {
                    let sql = if t % 2 == 0 {
                        "SELECT allowed FROM rate_limit.take_many(ARRAY['user', 'org'], ARRAY['u', 'o'])"
                    } else {
                        "SELECT allowed FROM rate_limit.take_many(ARRAY['org', 'user'], ARRAY['o', 'u'])"
                    };
                    let allowed: bool = client.query_one(sql, &[]).expect("take").get(0);
                    assert!(allowed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("no deadlock error in any client");
    }
}

/// A single policy under contention grants exactly its burst, in both stores.
#[test]
fn hot_policy_key_grants_exactly_the_burst() {
    for store in stores() {
        let db = TestDb::new(&format!("hot_policy_{store}"));
        db.connect()
            .execute(
                "SELECT rate_limit.create_policy('hot', 1, '1 day', 100, store => $1)",
                &[&store],
            )
            .expect("create policy");
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let mut client = db.connect();
                thread::spawn(move || {
                    (0..50)
                        .filter(|_| {
                            client
                                .query_one("SELECT allowed FROM rate_limit.take('hot', 'k')", &[])
                                .expect("take")
                                .get::<_, bool>(0)
                        })
                        .count()
                })
            })
            .collect();
        let granted: usize = handles.into_iter().map(|h| h.join().expect("client")).sum();
        assert_eq!(granted, 100, "{store}");
    }
}

/// `wait` sleeps until the token exists (1 s after the take that drained it), gives up without sleeping
/// when the timeout is too short, and is interrupted by statement_timeout and by a query cancel, taking
/// nothing. Every time bound is one the behaviour itself sets (the refill, the timeout), measured from
/// before the call it bounds.
#[test]
fn wait_sleeps_gives_up_and_is_interruptible() {
    let db = TestDb::new("wait");
    let mut client = db.connect();
    client
        .batch_execute(
            "SELECT rate_limit.create_policy('slow', 1, '1 second', 1);
             SELECT rate_limit.create_policy('daily', 1, '1 day', 1);
             SELECT rate_limit.create_policy('twenty', 1, '20 seconds', 1);",
        )
        .expect("create policies");
    let drained_at = Instant::now();
    client
        .query_one("SELECT allowed FROM rate_limit.take('slow', 'k')", &[])
        .expect("take");
    let allowed: bool = client
        .query_one(
            "SELECT allowed FROM rate_limit.wait('slow', 'k', 1, '5 seconds')",
            &[],
        )
        .expect("wait")
        .get(0);
    assert!(allowed, "the token exists within the timeout");
    assert!(
        drained_at.elapsed() >= Duration::from_secs(1),
        "granted {:?} after the drain, before the token existed",
        drained_at.elapsed()
    );

    // too short a timeout: returns without sleeping it out, denied, nothing taken
    client
        .query_one("SELECT allowed FROM rate_limit.take('daily', 'k')", &[])
        .expect("drain daily");
    let started = Instant::now();
    let allowed: bool = client
        .query_one(
            "SELECT allowed FROM rate_limit.wait('daily', 'k', 1, '1 second')",
            &[],
        )
        .expect("wait")
        .get(0);
    assert!(!allowed);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "it slept the timeout out"
    );

    // statement_timeout interrupts a wait that would sleep 20 s (within rate_limit.max_wait)
    client
        .query_one("SELECT allowed FROM rate_limit.take('twenty', 'k')", &[])
        .expect("drain twenty");
    client
        .batch_execute("SET statement_timeout = '300ms'")
        .expect("set");
    let started = Instant::now();
    let err = client
        .query_one("SELECT allowed FROM rate_limit.wait('twenty', 'k')", &[])
        .expect_err("statement_timeout ends the wait");
    assert_eq!(err.code(), Some(&SqlState::QUERY_CANCELED));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "slept until the refill"
    );
    client
        .batch_execute("RESET statement_timeout")
        .expect("reset");

    // a query cancel interrupts it too
    let cancel = client.cancel_token();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        cancel
            .cancel_query(postgres::NoTls)
            .expect("send the cancel request");
    });
    let started = Instant::now();
    let err = client
        .query_one("SELECT allowed FROM rate_limit.wait('twenty', 'k')", &[])
        .expect_err("cancel ends the wait");
    canceller.join().expect("canceller");
    assert_eq!(err.code(), Some(&SqlState::QUERY_CANCELED));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "slept until the refill"
    );
    assert_eq!(remaining(&mut client, "slow", "k"), 0);
    assert_eq!(remaining(&mut client, "twenty", "k"), 0);
}

/// A named policy whose buckets any role could leave short of full for longer than
/// `rate_limit.max_policy_refill_time` (400 days by default) is refused with 22023, whether by its
/// refill, its `max_debt` or its penalty box's `block_for`, in `create_policy` and `alter_policy`
/// (before: `max_debt => 9223372036854` let any role make buckets that refill in 292,000 years, which no
/// purge removes). A yearly quota fits; a superuser raises the bound knowingly, and no other role can.
#[test]
fn policies_whose_buckets_stay_short_too_long_are_refused() {
    let db = TestDb::new("policy_bounds");
    let mut admin = db.connect();
    let refused = |c: &mut Client, sql: &str| {
        let e = c.batch_execute(sql).expect_err(sql);
        assert_eq!(
            e.code(),
            Some(&SqlState::INVALID_PARAMETER_VALUE),
            "{sql}: {e:?}"
        );
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default()
    };
    for store in stores() {
        let message = refused(
            &mut admin,
            &format!("SELECT rate_limit.create_policy('dbig', 1, '1 second', max_debt => 9223372036854, store => '{store}')"),
        );
        assert!(
            message.contains("rate_limit.max_policy_refill_time"),
            "{message}"
        );
    }
    refused(
        &mut admin,
        "SELECT rate_limit.create_policy('pbig', 5, '1 minute', block_after => 3, block_for => '36524 days')",
    );
    refused(
        &mut admin,
        "SELECT rate_limit.create_policy('slow', 1, '1 day', burst => 401)",
    );
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('yearly', 1000, '1 year', algorithm => 'calendar_window');
             SELECT rate_limit.create_policy('slow', 1, '1 day', burst => 400);
             SELECT rate_limit.create_policy('box', 5, '1 minute', block_after => 3, block_for => '400 days');
             SELECT rate_limit.create_policy('debt', 1, '1 second', max_debt => 1000);",
        )
        .expect("within the bound");
    refused(
        &mut admin,
        "SELECT rate_limit.alter_policy('debt', max_debt => 9223372036854)",
    );
    refused(
        &mut admin,
        "SELECT rate_limit.alter_policy('box', block_for => '401 days')",
    );
    refused(
        &mut admin,
        "SELECT rate_limit.alter_policy('slow', burst => 401)",
    );
    // the superuser raises it knowingly
    admin
        .batch_execute(
            "SET rate_limit.max_policy_refill_time = '1000d';
             SELECT rate_limit.alter_policy('slow', burst => 401);
             RESET rate_limit.max_policy_refill_time;",
        )
        .expect("a raised bound");
    // a policy past the bound may still change what does not set it (shadow mode), not its numbers
    admin
        .batch_execute("SELECT rate_limit.alter_policy('slow', shadow => true)")
        .expect("shadow mode of a policy past the bound");
    refused(
        &mut admin,
        "SELECT rate_limit.alter_policy('slow', rate => 1)",
    );
    // nobody else can: a superuser's setting in the compiled edition; in the portable edition a session's,
    // read only by the owner's functions, which no other role may call
    let mut role = db.connect_as_login_role("rl_bound_role");
    let e = match edition() {
        Edition::Compiled => role
            .batch_execute("SET rate_limit.max_policy_refill_time = '1000d'")
            .expect_err("superuser only"),
        Edition::Portable => role
            .batch_execute(
                "SET rate_limit.max_policy_refill_time = '1000d';
                 SELECT rate_limit.create_policy('mine', 1, '1 day', burst => 401)",
            )
            .expect_err("the owner's function"),
    };
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

/// `rate_limit.max_wait` bounds a statement, not each call: eight waits chained in one statement (a join
/// over `generate_series`) on a policy of 1 token every 2 s, with `max_wait` 3 s, grant 2 tokens (the one
/// in the bucket, and one after a 2 s sleep) and give up on the other 6 at once, since the third would
/// end 4 s after the statement began; the statement returns within the bound (before: each call had its
/// own 3 s, the statement slept about 14 s holding its snapshot). In both stores.
#[test]
fn waits_chained_in_one_statement_share_max_wait() {
    let db = TestDb::new("wait_statement");
    let mut client = db.connect();
    client
        .batch_execute("SELECT rate_limit.create_policy('slow2', 1, '2 seconds', 1)")
        .expect("set up");
    db.set_max_wait(&mut client, "3s");
    for store in stores() {
        client
            .batch_execute(&format!("SET rate_limit.store = '{store}'"))
            .expect("store");
        let started = Instant::now();
        let granted: i64 = client
            .query_one(
                "SELECT count(*) FILTER (WHERE w.allowed) FROM generate_series(1, 8) g, \
                 LATERAL rate_limit.wait('slow2', $1 || left(g::text, 0)) w",
                &[&format!("k_{store}")],
            )
            .expect("chained waits")
            .get(0);
        let took = started.elapsed();
        assert_eq!(granted, 2, "{store}: took {took:?}");
        assert!(
            took < Duration::from_secs(8),
            "{store}: the statement slept {took:?}, past max_wait (3 s) and the work"
        );
    }
}

/// `wait` is bounded by `rate_limit.max_wait` (30 s by default, superuser-only): without a timeout it waits
/// at most that long, so a bucket that refills later is denied at once instead of holding the statement
/// until statement_timeout (before, it slept until the hour was over); a longer timeout is 22023; a role
/// with only LOGIN cannot raise the bound. While it sleeps the call holds its statement's snapshot
/// (`backend_xmin`), as docs/reference.md says: the bound is what limits it, and it is gone afterwards.
#[test]
fn wait_is_bounded_by_max_wait() {
    let db = TestDb::new("wait_bounded");
    let mut client = db.connect();
    let show: String = client
        .query_one(
            match edition() {
                Edition::Compiled => "SHOW rate_limit.max_wait",
                Edition::Portable => "SELECT rate_limit.max_wait()::text",
            },
            &[],
        )
        .expect("show")
        .get(0);
    assert!(["30s", "00:00:30"].contains(&show.as_str()), "{show}");
    client
        .batch_execute(
            "SELECT rate_limit.create_policy('hourly', 1, '1 hour', 1);
             SELECT rate_limit.create_policy('two', 1, '2 seconds', 1);
             SELECT rate_limit.take('hourly', 'k');
             SET statement_timeout = '10s';",
        )
        .expect("set up");
    let allowed: bool = client
        .query_one("SELECT allowed FROM rate_limit.wait('hourly', 'k')", &[])
        .expect("a wait without timeout returns within rate_limit.max_wait")
        .get(0);
    assert!(!allowed);
    let err = client
        .query_one(
            "SELECT allowed FROM rate_limit.wait('hourly', 'k', 1, '31 seconds')",
            &[],
        )
        .expect_err("a timeout over max_wait");
    assert_eq!(err.code(), Some(&SqlState::INVALID_PARAMETER_VALUE));
    assert!(err
        .as_db_error()
        .and_then(|e| e.hint())
        .unwrap_or_default()
        .contains("rate_limit.max_wait"));

    // what a sleeping wait holds: its snapshot, until it returns
    db.set_max_wait(&mut client, "3s");
    client
        .batch_execute("SELECT rate_limit.take('two', 'k')")
        .expect("drain two");
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);
    let waiter = thread::spawn(move || {
        let allowed: bool = client
            .query_one("SELECT allowed FROM rate_limit.wait('two', 'k')", &[])
            .expect("wait")
            .get(0);
        (allowed, client)
    });
    let mut observer = db.connect();
    let mut seen_holding = false;
    while !waiter.is_finished() {
        // between two sleeps the backend runs, and its wait_event is NULL: that is "not seen", not an error
        let row = observer
            .query_one(
                "SELECT coalesce(wait_event IN ('Extension', 'PgSleep'), false) \
                 AND backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .expect("observe");
        seen_holding |= row.get::<_, bool>(0);
        thread::sleep(Duration::from_millis(20));
    }
    let (allowed, _client) = waiter.join().expect("waiter");
    assert!(allowed, "the token came within max_wait");
    assert!(
        seen_holding,
        "never saw the sleeping wait with its snapshot"
    );
    let xmin_after: bool = observer
        .query_one(
            "SELECT backend_xmin IS NULL FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .expect("after")
        .get(0);
    assert!(xmin_after, "the snapshot outlived the wait");

    // the bound is the superuser's (the owner's, in the portable edition)
    let mut role = db.connect_as_login_role("rl_wait_role");
    let err = role
        .batch_execute(match edition() {
            Edition::Compiled => "SET rate_limit.max_wait = '1h'",
            Edition::Portable => {
                "CREATE OR REPLACE FUNCTION rate_limit.max_wait() RETURNS interval \
                 LANGUAGE sql IMMUTABLE AS $$ SELECT interval '1 hour' $$"
            }
        })
        .expect_err("only a superuser sets max_wait");
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

/// Policies are an extension configuration table: pg_dump writes them and a restore brings them back.
#[test]
fn policies_survive_dump_and_restore() {
    let bindir = rate_limit_integration::env("RATE_LIMIT_TEST_BINDIR");
    let source = TestDb::new("dump_source");
    source
        .connect()
        .batch_execute(
            "SELECT rate_limit.create_policy('kept', 7, '1 hour', 3, 'token_bucket', 'memory');
             SELECT rate_limit.create_policy('kept_window', 5, '10 minutes', algorithm => 'sliding_window');",
        )
        .expect("create policies");
    let target = TestDb::new("dump_target");
    target.uninstall();
    let server = rate_limit_integration::conninfo();
    let dump = Command::new(format!("{bindir}/pg_dump"))
        .arg("--dbname")
        .arg(format!("{server} dbname={}", source.name()))
        .output()
        .expect("run pg_dump");
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let mut restore = Command::new(format!("{bindir}/psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "--dbname"])
        .arg(format!("{server} dbname={}", target.name()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run psql");
    {
        use std::io::Write;
        let mut stdin = restore.stdin.take().expect("psql stdin");
        stdin.write_all(&dump.stdout).expect("feed the dump");
    }
    assert!(restore.wait().expect("psql").success());
    let rows = target
        .connect()
        .query(
            "SELECT name, algorithm, rate, per::text, burst, store FROM rate_limit.policies ORDER BY name",
            &[],
        )
        .expect("read policies");
    let got: Vec<(String, String, i64, String, i64, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "kept".into(),
                "token_bucket".into(),
                7,
                "01:00:00".into(),
                3,
                Some("memory".into())
            ),
            (
                "kept_window".into(),
                "sliding_window".into(),
                5,
                "00:10:00".into(),
                5,
                None
            ),
        ]
    );
    let allowed: bool = target
        .connect()
        .query_one(
            "SELECT allowed FROM rate_limit.take('kept_window', 'k')",
            &[],
        )
        .expect("take after restore")
        .get(0);
    assert!(allowed);
}

/// A policy changed in one session is seen by another session's next transaction (the cache is
/// invalidated), and a policy dropped elsewhere is gone.
#[test]
fn policy_changes_reach_other_sessions() {
    let db = TestDb::new("policy_cache");
    let mut admin = db.connect();
    let mut other = db.connect();
    admin
        .batch_execute("SELECT rate_limit.create_policy('p', 1, '1 day', 2)")
        .expect("create");
    let limit: i64 = other
        .query_one("SELECT \"limit\" FROM rate_limit.peek('p', 'k')", &[])
        .expect("peek")
        .get(0);
    assert_eq!(limit, 2);
    admin
        .batch_execute("SELECT rate_limit.alter_policy('p', burst => 9)")
        .expect("alter");
    let limit: i64 = other
        .query_one("SELECT \"limit\" FROM rate_limit.peek('p', 'k')", &[])
        .expect("peek")
        .get(0);
    assert_eq!(limit, 9);
    admin
        .batch_execute("SELECT rate_limit.drop_policy('p')")
        .expect("drop");
    let err = other
        .query_one("SELECT \"limit\" FROM rate_limit.peek('p', 'k')", &[])
        .expect_err("dropped");
    assert_eq!(err.code(), Some(&SqlState::UNDEFINED_OBJECT));
}

/// The portable edition's take decides most calls from its own copy of each policy's numbers
/// (rate_limit._fast_policies, kept by a trigger on rate_limit.policies): a change made to the table by
/// hand, by its owner, reaches the next call as one through alter_policy does: a shadow policy grants
/// past its burst, a deleted one is unknown (42704), a truncated table leaves no policy behind. (The
/// compiled edition has no such copy; its own caches follow alter_policy, tested above.)
#[test]
fn the_portable_fast_path_follows_policies_changed_by_hand() {
    if edition() != Edition::Portable {
        eprintln!("skipped in the compiled edition: the portable edition's copy of policies");
        return;
    }
    let db = TestDb::new("policy_by_hand");
    let mut owner = db.connect();
    let allowed = |c: &mut Client, policy: &str| -> bool {
        c.query_one("SELECT allowed FROM rate_limit.take($1, 'k')", &[&policy])
            .expect("take")
            .get(0)
    };
    owner
        .batch_execute(
            "SELECT rate_limit.create_policy('p', 1, '1 day', 1);
             SELECT rate_limit.create_policy('q', 1, '1 day', 1);",
        )
        .expect("create");
    assert!(allowed(&mut owner, "p"));
    assert!(!allowed(&mut owner, "p"), "burst 1");
    let copied = |c: &mut Client| -> Vec<String> {
        c.query(
            "SELECT name FROM rate_limit._fast_policies ORDER BY name",
            &[],
        )
        .expect("the copy")
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    assert_eq!(copied(&mut owner), ["p", "q"]);
    owner
        .batch_execute("UPDATE rate_limit.policies SET shadow = true WHERE name = 'p'")
        .expect("by hand");
    assert_eq!(
        copied(&mut owner),
        ["q"],
        "a shadow policy is not the fast path's"
    );
    assert!(
        allowed(&mut owner, "p"),
        "in shadow mode: granted past its burst"
    );
    owner
        .batch_execute("UPDATE rate_limit.policies SET shadow = false, burst = 3 WHERE name = 'p'")
        .expect("by hand");
    assert_eq!(copied(&mut owner), ["p", "q"]);
    let burst: i64 = owner
        .query_one(
            "SELECT burst FROM rate_limit._fast_policies WHERE name = 'p'",
            &[],
        )
        .expect("the copy")
        .get(0);
    assert_eq!(burst, 3);
    owner
        .batch_execute("DELETE FROM rate_limit.policies WHERE name = 'p'")
        .expect("by hand");
    let err = owner
        .query_one("SELECT allowed FROM rate_limit.take('p', 'k')", &[])
        .expect_err("deleted");
    assert_eq!(err.code(), Some(&SqlState::UNDEFINED_OBJECT));
    owner
        .batch_execute("TRUNCATE rate_limit.policies CASCADE")
        .expect("by hand");
    assert!(copied(&mut owner).is_empty());
    let err = owner
        .query_one("SELECT allowed FROM rate_limit.take('q', 'k')", &[])
        .expect_err("truncated");
    assert_eq!(err.code(), Some(&SqlState::UNDEFINED_OBJECT));
}
