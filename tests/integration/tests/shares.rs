//! The memory store closed to abuse, tried as a role with only LOGIN would:
//! - a flood of new keys from one database fills only that database's share (`rate_limit.database_share`,
//!   50% by default) of the server's memory store, under both `rate_limit.on_full` settings: another
//!   database's new keys still get exactly their limits, and its drained key stays drained (nothing of it
//!   was evicted or reset). Each refusal is 53200 naming the share, with a hint that does not recommend
//!   `evict_oldest` (small server: 256 buckets in 4 partitions, so the flood is quick);
//! - a LOGIN role flooding from 5 databases at once, with every function it may execute that makes
//!   buckets, in both stores and under both `on_full` settings, holds at most its role's share
//!   (`rate_limit.role_share`, 50%) of the store, and a victim role in a 6th database stays exact: no
//!   53200, its drained keys still drained, its new keys given exactly their limits;
//! - limits that would take longer than `rate_limit.max_refill_time` to refill are refused with 22023 for
//!   such a role (they could never be purged), and accepted for the extension's owner.

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use rate_limit_integration::surface::{functions, Access, Function, Schema};
use rate_limit_integration::{conninfo, env, memory_usage as usage, stores, TestDb};

const ROLE: &str = "rl_login_only";

/// Creates the role with only LOGIN (dropping a leftover one) and returns an admin connection to `server`.
fn login_only_role(server: &str) -> Client {
    let mut admin = Client::connect(&format!("{server} dbname=postgres"), NoTls).expect("admin");
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {ROLE}; CREATE ROLE {ROLE} LOGIN"
        ))
        .expect("create the role");
    admin
}

fn connect_as_role(server: &str, db: &TestDb) -> Client {
    Client::connect(&format!("{server} dbname={} user={ROLE}", db.name()), NoTls)
        .expect("connect as the login-only role")
}

fn take(client: &mut Client, policy: &str, key: &str) -> (bool, i64) {
    let row = client
        .query_one(
            "SELECT allowed, remaining FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .expect("take");
    (row.get(0), row.get(1))
}

#[test]
fn a_flood_in_one_database_neither_refuses_nor_resets_another_databases_buckets() {
    let server = env("RATE_LIMIT_TEST_SMALL_CONNINFO");
    let mut admin = login_only_role(&server);
    let victim = TestDb::on(&server, "share_victim");
    let flooded = TestDb::on(&server, "share_flooded");

    // the victim's limits before the flood: a key drained under a policy of 5 a day
    let mut v = victim.connect_memory();
    v.batch_execute("SELECT rate_limit.create_policy('daily', 5, '1 day', store => 'memory')")
        .expect("policy");
    for i in 0..5 {
        assert_eq!(take(&mut v, "daily", "alice"), (true, 4 - i));
    }
    assert_eq!(take(&mut v, "daily", "alice"), (false, 0));
    let share_buckets = usage(&mut v, "share_buckets");
    assert_eq!(usage(&mut v, "share_percent"), 50, "the default share");
    assert_eq!(share_buckets, 128, "half of 256 buckets");

    for on_full in ["error", "evict_oldest"] {
        // on_full is a superuser setting: the flooding role gets it from its role's settings
        admin
            .batch_execute(&format!(
                "ALTER ROLE {ROLE} SET rate_limit.on_full = '{on_full}'"
            ))
            .expect("set on_full for the role");
        let mut a = connect_as_role(&server, &flooded);
        a.batch_execute("SET rate_limit.store = 'memory'")
            .expect("memory store");
        // more new keys than the whole store holds, each refilling in a day (never evictable losslessly)
        let (mut stored, mut refused) = (0, 0);
        for i in 0..600 {
            let key = format!("{on_full}-{i}");
            match a.query_one(
                "SELECT allowed FROM rate_limit.take_ad_hoc($1, 1, '1 day')",
                &[&key],
            ) {
                Ok(_) => stored += 1,
                Err(e) => {
                    assert_eq!(e.code(), Some(&SqlState::OUT_OF_MEMORY), "{e:?}");
                    let db_error = e.as_db_error().expect("a server error");
                    assert_eq!(
                        db_error.message(),
                        "this database's share of the rate_limit memory store is full"
                    );
                    let hint = db_error.hint().unwrap_or_default();
                    assert!(hint.contains("rate_limit.database_share"), "{hint}");
                    assert!(!hint.contains("evict_oldest"), "{hint}");
                    refused += 1;
                }
            }
        }
        let held = usage(&mut a, "database_buckets");
        assert!(
            held <= share_buckets,
            "{on_full}: the flooded database holds {held} buckets, its share is {share_buckets}"
        );
        match on_full {
            "error" => assert!(
                refused > 0 && stored <= share_buckets,
                "error: {stored} stored, {refused} refused"
            ),
            _ => assert_eq!(
                refused, 0,
                "evict_oldest evicts the database's own oldest bucket"
            ),
        }

        // the victim, from a fresh backend: the drained key is still drained, new keys get their limits
        let mut v = victim.connect_memory();
        assert_eq!(
            take(&mut v, "daily", "alice"),
            (false, 0),
            "{on_full}: the flood reset another database's bucket"
        );
        for i in 0..30 {
            let remaining: i32 = v
                .query_one(
                    "SELECT rate_limiting_request($1, 1, 10)",
                    &[&format!("{on_full}-new-{i}")],
                )
                .unwrap_or_else(|e| panic!("{on_full}: another database's new key failed: {e:?}"))
                .get(0);
            assert_eq!(remaining, 9, "{on_full}: a new key of another database");
        }
    }
    admin
        .batch_execute(&format!("ALTER ROLE {ROLE} RESET rate_limit.on_full"))
        .expect("reset the role");
}

#[test]
fn limits_that_refill_slower_than_max_refill_time_are_the_owners_alone() {
    let server = conninfo();
    let _admin = login_only_role(&server);
    let db = TestDb::new("max_refill_time");
    let mut owner = db.connect();
    let mut role = connect_as_role(&server, &db);
    let slow_calls = [
        "SELECT allowed FROM rate_limit.take_ad_hoc($1, 1, '36500000 days')",
        "SELECT allowed FROM rate_limit.take_ad_hoc($1, 1, '106751991 days')",
        "SELECT allowed FROM rate_limit.take_ad_hoc($1, 1, '1 hour', burst => 25)",
        "SELECT rate_limiting_request($1, 1, 2147483647) >= 0",
        "SELECT rate_limiting_request($1, 1, 86401) >= 0",
    ];
    for store in stores() {
        for client in [&mut role, &mut owner] {
            client
                .batch_execute(&format!("SET rate_limit.store = '{store}'"))
                .expect("store");
        }
        for (i, sql) in slow_calls.iter().enumerate() {
            let key = format!("slow-{store}-{i}");
            let e = role.query_one(*sql, &[&key]).expect_err(sql);
            assert_eq!(
                e.code(),
                Some(&SqlState::INVALID_PARAMETER_VALUE),
                "{sql}: {e:?}"
            );
            let db_error = e.as_db_error().expect("a server error");
            assert!(
                db_error
                    .message()
                    .contains("rate_limit.max_refill_time allows 86400 s"),
                "{}",
                db_error.message()
            );
            assert!(db_error
                .hint()
                .unwrap_or_default()
                .contains("create_policy"));
            let allowed: bool = owner.query_one(*sql, &[&key]).expect(sql).get(0);
            assert!(allowed, "the owner may: {sql}");
        }
        // at the bound, and peeks (which create nothing), any role may
        for (i, sql) in [
            "SELECT allowed FROM rate_limit.take_ad_hoc($1, 1, '1 day')",
            "SELECT allowed FROM rate_limit.take_ad_hoc($1, 24, '1 day', burst => 24)",
            "SELECT rate_limiting_request($1, 1, 86400) >= 0",
            "SELECT rate_limit.peek_request($1, 1, 2147483647) >= 0",
            "SELECT allowed FROM rate_limit.take_ad_hoc($1, 1, '36500000 days', cost => 0)",
        ]
        .iter()
        .enumerate()
        {
            let key = format!("bounded-{store}-{i}");
            let allowed: bool = role.query_one(*sql, &[&key]).expect(sql).get(0);
            assert!(allowed, "{sql}");
        }
    }
}

/// The functions that any role may execute and that take tokens (`takes_tokens` in the SQL surface's
/// table), each with a statement of the flood (`$1` a fresh key, `{store}` the pass's store): a new one
/// fails the test below until it has its statement here.
const FLOOD_CALLS: &[(&str, &str)] = &[
    (
        "rate_limiting_request(text,integer,integer)",
        "SELECT rate_limiting_request($1, 1, 86400) >= 0",
    ),
    (
        "rate_limit.take_ad_hoc(text,bigint,interval,bigint,integer)",
        "SELECT allowed FROM rate_limit.take_ad_hoc($1, 1, '1 day')",
    ),
    (
        "rate_limit.take(text,text,integer)",
        "SELECT bool_or(allowed) FROM generate_series(1, 3), LATERAL rate_limit.take('{store}_boxed', $1)",
    ),
    (
        "rate_limit.allow(text,text,integer)",
        "SELECT bool_or(a) FROM generate_series(1, 3), LATERAL rate_limit.allow('{store}_boxed', $1) AS a",
    ),
    (
        "rate_limit.take_many(text[],text[],integer)",
        "SELECT allowed FROM rate_limit.take_many(ARRAY['{store}_daily', '{store}_hourly'], ARRAY[$1])",
    ),
    (
        "rate_limit.take_batch(text,text[],integer[],boolean)",
        "SELECT bool_or(allowed) FROM rate_limit.take_batch('{store}_daily', ARRAY[$1, $1 || '.1', $1 || '.2'])",
    ),
    (
        "rate_limit.wait(text,text,integer,interval)",
        "SELECT allowed FROM rate_limit.wait('{store}_daily', $1, 1, '1 second')",
    ),
    (
        "rate_limit.charge(text,text,bigint)",
        "SELECT allowed FROM rate_limit.charge('{store}_debt', $1, 50)",
    ),
    (
        "rate_limit.acquire(text,text)",
        "SELECT allowed FROM rate_limit.acquire('{store}_leases', $1)",
    ),
    (
        "rate_limit.reserve(text,text,bigint,interval,jsonb)",
        "SELECT allowed FROM rate_limit.reserve('{store}_daily', $1, 1)",
    ),
    (
        "rate_limit.reserve_many(text[],text,bigint[],interval,jsonb)",
        "SELECT allowed FROM rate_limit.reserve_many(ARRAY['{store}_daily', '{store}_hourly'], $1, ARRAY[1])",
    ),
    (
        "rate_limit.book(text,text,bigint,interval)",
        "SELECT allowed FROM rate_limit.book('{store}_debt', $1, 1)",
    ),
    (
        "rate_limit.limit_writes()",
        "WITH w AS (INSERT INTO pg_temp.writes_{store} VALUES ($1) RETURNING k) SELECT count(*) = 1 FROM w",
    ),
];

/// The functions any role may execute that take no tokens, so make no bucket (reads, a release, the
/// owner's triggers), as their entries in the SQL surface's table say (`takes_tokens`).
fn make_nothing() -> Vec<String> {
    functions()
        .filter(|f| f.access == Access::Public && !f.takes_tokens)
        .map(regprocedure)
        .collect()
}

/// A function as `regprocedure` prints it for a role whose search_path has the extension's schema.
fn regprocedure(f: &Function) -> String {
    let name = match f.schema {
        Schema::Extension => f.name.to_string(),
        Schema::RateLimit => format!("rate_limit.{}", f.name),
    };
    format!("{name}({})", f.arguments.replace(", ", ","))
}

const FLOODER: &str = "rl_flooder";
const VICTIM: &str = "rl_victim";

/// The policies of every test database, in both stores, made by the owner.
fn create_policies(db: &TestDb) {
    let mut owner = db.connect();
    for store in ["memory", "table"] {
        owner
            .batch_execute(&format!(
                "SELECT rate_limit.create_policy('{store}_daily', 5, '1 day', store => '{store}');
                 SELECT rate_limit.create_policy('{store}_hourly', 5, '1 hour', store => '{store}');
                 SELECT rate_limit.create_policy('{store}_debt', 5, '1 hour', max_debt => 100, store => '{store}');
                 SELECT rate_limit.create_policy('{store}_leases', 2, '1 hour', algorithm => 'concurrency', store => '{store}');
                 SELECT rate_limit.create_policy('{store}_boxed', 1, '1 hour', block_after => 1, block_for => '1 hour', store => '{store}');"
            ))
            .expect("the owner's policies");
    }
}

/// The flooder's connection to `db`, with its temporary tables under `limit_writes` in both stores.
fn flooder(server: &str, db: &TestDb) -> Client {
    let mut c = Client::connect(
        &format!("{server} dbname={} user={FLOODER}", db.name()),
        NoTls,
    )
    .expect("connect as the flooder");
    for store in ["memory", "table"] {
        c.batch_execute(&format!(
            "CREATE TEMP TABLE writes_{store} (k text NOT NULL);
             CREATE TRIGGER limited BEFORE INSERT ON writes_{store} FOR EACH ROW
                 EXECUTE FUNCTION rate_limit.limit_writes('{store}_daily', 'k')"
        ))
        .expect("a temporary table under limit_writes");
    }
    c
}

/// The victim's exact limits while the flood runs: its drained key is still drained in both stores, and
/// new keys get exactly their limit (5 then a denial; 9 left of 10 for `rate_limiting_request`).
fn victim_is_exact(v: &mut Client, pass: &str) {
    for store in ["memory", "table"] {
        v.batch_execute(&format!("SET rate_limit.store = '{store}'"))
            .expect("store");
        assert_eq!(
            take(v, &format!("{store}_daily"), "alice"),
            (false, 0),
            "{pass}: the victim's drained {store} bucket was lost or reset"
        );
        for i in 0..8 {
            let key = format!("{pass}-{store}-{i}");
            for left in (0..5).rev() {
                let got = v
                    .query_one(
                        "SELECT allowed, remaining FROM rate_limit.take($1, $2)",
                        &[&format!("{store}_daily"), &key],
                    )
                    .map(|r| (r.get::<_, bool>(0), r.get::<_, i64>(1)))
                    .unwrap_or_else(|e| {
                        panic!("{pass}: the victim's new {store} key failed: {e:?}")
                    });
                assert_eq!(got, (true, left), "{pass}: {store} key {key}");
            }
            assert_eq!(
                take(v, &format!("{store}_daily"), &key),
                (false, 0),
                "{pass}: {store} key {key} after its limit"
            );
            let remaining: i32 = v
                .query_one("SELECT rate_limiting_request($1, 1, 10)", &[&key])
                .unwrap_or_else(|e| panic!("{pass}: the victim's new request key failed: {e:?}"))
                .get(0);
            assert_eq!(remaining, 9, "{pass}: {store} request key {key}");
        }
    }
}

#[test]
fn a_role_flooding_from_five_databases_leaves_a_victim_role_in_a_sixth_exact() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    let server = env("RATE_LIMIT_TEST_SMALL_CONNINFO");
    empty_small_store();
    let mut admin = Client::connect(&format!("{server} dbname=postgres"), NoTls).expect("admin");
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {FLOODER}; CREATE ROLE {FLOODER} LOGIN;
             DROP ROLE IF EXISTS {VICTIM}; CREATE ROLE {VICTIM} LOGIN;"
        ))
        .expect("the two roles, with LOGIN only");
    let flooded: Vec<Arc<TestDb>> = (0..5)
        .map(|i| Arc::new(TestDb::on(&server, &format!("flood_{i}"))))
        .collect();
    let victim_db = TestDb::on(&server, "flood_victim");
    for db in flooded.iter().map(|d| d.as_ref()).chain([&victim_db]) {
        create_policies(db);
    }

    // every function the flooder may execute is flooded, or makes nothing
    let mut f = flooder(&server, &flooded[0]);
    let executable: Vec<String> = f
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
             JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'rate_limit'
             WHERE has_function_privilege(p.oid, 'EXECUTE') ORDER BY 1",
            &[],
        )
        .expect("the functions the role may execute")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut executable = executable;
    executable.sort();
    let mut known: Vec<String> = FLOOD_CALLS
        .iter()
        .map(|(f, _)| f.to_string())
        .chain(make_nothing())
        .collect();
    known.sort();
    let mut taking: Vec<String> = functions()
        .filter(|f| f.access == Access::Public && f.takes_tokens)
        .map(regprocedure)
        .collect();
    taking.sort();
    let mut flooded_calls: Vec<String> = FLOOD_CALLS.iter().map(|(f, _)| f.to_string()).collect();
    flooded_calls.sort();
    assert_eq!(
        flooded_calls, taking,
        "the flood has one statement for each PUBLIC function that takes tokens"
    );
    assert_eq!(
        executable, known,
        "a PUBLIC function is neither flooded nor known to make nothing"
    );
    drop(f);

    // the victim's limits before the flood: a key drained in each store
    let mut v = Client::connect(
        &format!("{server} dbname={} user={VICTIM}", victim_db.name()),
        NoTls,
    )
    .expect("connect as the victim");
    for store in ["memory", "table"] {
        for left in (0..5).rev() {
            assert_eq!(
                take(&mut v, &format!("{store}_daily"), "alice"),
                (true, left)
            );
        }
    }

    for store in ["memory", "table"] {
        for on_full in ["error", "evict_oldest"] {
            let pass = format!("{store}-{on_full}");
            admin
                .batch_execute(&format!(
                    "ALTER ROLE {FLOODER} SET rate_limit.on_full = '{on_full}';
                     ALTER ROLE {FLOODER} SET rate_limit.store = '{store}'"
                ))
                .expect("the flooder's settings (superuser-only: set for its role)");
            let stop = Arc::new(AtomicBool::new(false));
            let refused = Arc::new(AtomicUsize::new(0));
            let calls = Arc::new(AtomicUsize::new(0));
            let warmed_up = Arc::new(Barrier::new(flooded.len() + 1));
            let floods: Vec<_> = flooded
                .iter()
                .enumerate()
                .map(|(d, db)| {
                    let (db, server, pass) = (Arc::clone(db), server.clone(), pass.clone());
                    let (stop, refused, calls) = (stop.clone(), refused.clone(), calls.clone());
                    let warmed_up = warmed_up.clone();
                    std::thread::spawn(move || {
                        let mut c = flooder(&server, &db);
                        let mut warming = true;
                        let mut i = 0usize;
                        while warming || !stop.load(Ordering::Relaxed) {
                            let (function, sql) = FLOOD_CALLS[i % FLOOD_CALLS.len()];
                            let sql = sql.replace("{store}", store);
                            let key = format!("{pass}-{d}-{i}");
                            match c.query_one(&sql, &[&key]) {
                                Ok(_) => {}
                                Err(e) if store == "memory" && e.code() == Some(&SqlState::OUT_OF_MEMORY) => {
                                    refused.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => panic!("{pass}: the flooder's {function}: {e:?}"),
                            }
                            calls.fetch_add(1, Ordering::Relaxed);
                            i += 1;
                            // 300 new keys from each of 5 databases: far more than the whole store holds
                            if warming && i == 300 {
                                warming = false;
                                warmed_up.wait();
                            }
                        }
                        let held: (i64, i64) = c
                            .query_one(
                                "SELECT role_buckets, role_share_buckets FROM rate_limit.memory_usage()",
                                &[],
                            )
                            .map(|r| (r.get(0), r.get(1)))
                            .expect("memory_usage");
                        held
                    })
                })
                .collect();
            warmed_up.wait();
            // the victim, in the middle of the flood
            victim_is_exact(&mut v, &pass);
            stop.store(true, Ordering::Relaxed);
            for flood in floods {
                let (held, cap) = flood.join().expect("a flood thread");
                assert!(
                    held <= cap,
                    "{pass}: the flooder holds {held} buckets, its share is {cap}"
                );
                assert_eq!(cap, 128, "half of 256 buckets");
            }
            let (calls, refused) = (
                calls.load(Ordering::Relaxed),
                refused.load(Ordering::Relaxed),
            );
            eprintln!("{pass}: {calls} flood calls, {refused} refused with 53200");
            match (store, on_full) {
                ("memory", "error") => {
                    assert!(refused > 0, "{pass}: the flood never filled its share")
                }
                ("memory", _) => assert_eq!(
                    refused, 0,
                    "{pass}: evict_oldest evicts the flooder's own buckets"
                ),
                _ => assert_eq!(refused, 0, "{pass}: the table store has no share to fill"),
            }
        }
    }
    admin
        .batch_execute(&format!("ALTER ROLE {FLOODER} RESET ALL"))
        .expect("reset the role");
    // the flood's buckets, in databases about to be dropped, would take room from the tests that follow
    drop((flooded, victim_db, v));
    empty_small_store();
}

/// Empties the small server's memory store: a restart without its snapshot (the buckets of earlier tests'
/// dropped databases count against nobody's share, but take room; its purge worker is off).
fn empty_small_store() {
    let _stopped = rate_limit_integration::StoppedServer::stop(
        "RATE_LIMIT_TEST_SMALL_STOP",
        "RATE_LIMIT_TEST_SMALL_START",
    );
    let snapshot = format!(
        "{}/pg_stat/rate_limit.memory",
        env("RATE_LIMIT_TEST_SMALL_DATA")
    );
    let _ = std::fs::remove_file(snapshot);
}
