//! rate_limit behind a PL/Proxy router (`router/plproxy.sql`): a router database on one server, forwarding to
//! two partitions, each its own server with the extension (`scripts/test.sh` starts them for PostgreSQL 15,
//! with Debian's PL/Proxy).
//!
//! - `create_router` checks its arguments (22004, 22023) and is repeatable; set up again over a router of
//!   an older version, it leaves none of the older signatures;
//! - a key hammered through the router by many connections is exact, and its bucket lives on the one
//!   partition its hash names;
//! - policies made, changed and dropped through the router are so on every partition, calendar quotas with
//!   their zone and anchor too; leases are acquired and released through it;
//! - the router's `stats`, `top_limited` and `buckets` merge the partitions';
//! - a partition's own errors keep their SQLSTATE; `take_many` over keys of two partitions is 0A000;
//! - a partition that is down: keys on the other one are served; on a `fail_closed` router its keys fail
//!   with 08006; on a `fail_open` one the calls that take are allowed and counted, reads still fail with
//!   08006.
//!
//! - a partition that is frozen (SIGSTOP: it accepts connections and never answers) ends every call within
//!   the router's timeout, from a session that had reached it and from a new one, with 08006 or allowed as
//!   the router chose, and is used again once it resumes;
//! - a role with only LOGIN takes through the router (and through a `fail_open` one while a partition is
//!   down), and is refused the owner's calls (42501), as on one server;
//! - the router forwards exactly the SQL surface's forwarded functions (`src/surface/`), each with
//!   its signature, its route and its privilege;
//! - no caller's search_path changes what a router function does or where it routes a key: look-alike
//!   operators, functions, aggregates, types, tables and sequences in a schema before pg_catalog, in
//!   `public` (where PostgreSQL 13 and 14 let every role create) and in pg_temp are never called, and
//!   every answer equals a clean session's, also while a partition is down on a fail_open router;
//! - a key whose row another transaction holds on its partition is that key's problem: the partition
//!   gives the call up at its own lock timeout (half the router's) with nothing taken, the router answers
//!   55P03, never "allowed" (before: a fail_open router allowed it, and the call kept waiting on the
//!   partition, where it took the token once the lock was released);
//! - the router's deadline never outlives the call or transaction that armed it (COMMIT, ROLLBACK, a
//!   savepoint's end, DISCARD ALL): before, it cancelled the session's next statement.
//!
//! `RATE_LIMIT_TEST_PLPROXY` names the router's server and the two partitions' servers, separated by `;`
//! (connection strings without a database); `none` skips these tests.

use std::sync::{Mutex, MutexGuard, OnceLock};

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use rate_limit_integration::surface::{functions, Access, Route};
use rate_limit_integration::{
    fresh_name, hammer_conserves_tokens, servers_or_skip, Caller, FrozenServer, StoppedServer,
};

const ROUTER: &str = "rl_router";
const PARTITION: &str = "rl_partition";

/// The servers, router first, or `None` when this run skips PL/Proxy.
fn servers() -> Option<Vec<String>> {
    servers_or_skip(
        "RATE_LIMIT_TEST_PLPROXY",
        "scripts/test.sh runs the PL/Proxy tests on 15",
    )
}

fn connect(server: &str, db: &str) -> Client {
    Client::connect(&format!("{server} dbname={db}"), NoTls).expect("connect")
}

fn fresh_database(server: &str, db: &str) {
    let mut admin = connect(server, "postgres");
    for statement in [
        format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
        format!("CREATE DATABASE {db}"),
    ] {
        admin.batch_execute(&statement).expect("a fresh database");
    }
}

/// The partitions' connection strings as the router's cluster lists them.
fn partitions(servers: &[String]) -> Vec<String> {
    servers[1..]
        .iter()
        .map(|s| format!("{s} dbname={PARTITION}"))
        .collect()
}

/// Sets the router up once per run; every test holds the returned lock (they change the router's mode and
/// stop a partition).
fn router() -> Option<(MutexGuard<'static, ()>, &'static [String])> {
    static SET_UP: OnceLock<Option<Vec<String>>> = OnceLock::new();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let servers = SET_UP
        .get_or_init(|| {
            let servers = servers()?;
            for partition in &servers[1..] {
                fresh_database(partition, PARTITION);
                connect(partition, PARTITION)
                    .batch_execute("CREATE EXTENSION rate_limit")
                    .expect("the extension on a partition");
            }
            fresh_database(&servers[0], ROUTER);
            let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../router/plproxy.sql");
            let sql = std::fs::read_to_string(file).expect("router/plproxy.sql");
            let mut r = connect(&servers[0], ROUTER);
            r.batch_execute(&sql).expect("router/plproxy.sql runs");
            r.batch_execute(&sql).expect("and runs again");
            set_mode(&mut r, &servers, "fail_closed");
            Some(servers)
        })
        .as_deref()?;
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    Some((guard, servers))
}

fn set_mode(router: &mut Client, servers: &[String], mode: &str) {
    set_up(router, servers, mode, "2 seconds");
}

/// Sets the router up with `mode` and `timeout`.
fn set_up(router: &mut Client, servers: &[String], mode: &str, timeout: &str) {
    let steps = router
        .query(
            "SELECT * FROM rate_limit_router.create_router('rate_limit', $1, $2, $3::text::interval)",
            &[&partitions(servers), &mode, &timeout],
        )
        .expect("create_router");
    let forwarded = functions()
        .filter(|f| f.route != Route::NotForwarded)
        .count();
    assert_eq!(
        steps.len(),
        forwarded + 2,
        "the cluster, every forwarded call and the merged views"
    );
}

/// The partition (0 or 1) that holds `key`, as PL/Proxy maps it: hashtext(key) & (partitions - 1).
fn partition_of(router: &mut Client, key: &str) -> usize {
    let p: i32 = router
        .query_one("SELECT hashtext($1) & 1", &[&key])
        .expect("hash")
        .get(0);
    p as usize
}

/// A key with `prefix` on partition `p`.
fn key_on(router: &mut Client, p: usize, prefix: &str) -> String {
    (0..1000)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| partition_of(router, k) == p)
        .expect("a key on that partition")
}

fn code(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

#[test]
fn create_router_checks_its_arguments() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let three = vec![partitions(servers)[0].clone(); 3];
    /// partitions, on_partition_down, the SQLSTATE wanted
    type Case<'a> = (Option<Vec<String>>, Option<&'a str>, &'a str);
    let cases: [Case<'_>; 4] = [
        (Some(three), Some("fail_closed"), "22023"),
        (Some(Vec::new()), Some("fail_closed"), "22023"),
        (Some(partitions(servers)), Some("fail_sideways"), "22023"),
        (None, Some("fail_open"), "22004"),
    ];
    for (partitions, mode, want) in cases {
        let e = r
            .query(
                "SELECT * FROM rate_limit_router.create_router('rate_limit', $1, $2)",
                &[&partitions, &mode],
            )
            .expect_err("refused");
        assert_eq!(code(&e), want, "{partitions:?} {mode:?}: {e:?}");
    }
    // still routing as before
    r.query("SELECT rate_limiting_request($1)", &[&fresh_name("still")])
        .expect("the router still works");
}

#[test]
fn setting_up_again_leaves_no_signature_of_an_older_router() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    // what a router set up for 0.3.0 had: create_policy and alter_policy without shadow and max_debt
    r.batch_execute(
        "CREATE FUNCTION rate_limit.create_policy(name text, rate bigint, per interval, burst bigint, \
           algorithm text, store text) RETURNS void LANGUAGE sql AS 'SELECT'; \
         CREATE FUNCTION rate_limit.alter_policy(name text, rate bigint, per interval, burst bigint, \
           algorithm text) RETURNS void LANGUAGE sql AS 'SELECT'; \
         CREATE FUNCTION rate_limit_router.create_policy_remote(name text, rate bigint, per interval, \
           burst bigint, algorithm text, store text) RETURNS SETOF integer LANGUAGE sql AS 'SELECT 1'",
    )
    .expect("the old signatures");
    set_mode(&mut r, servers, "fail_closed");
    let overloads: Vec<(String, i64)> = r
        .query(
            "SELECT proname::text, count(*) FROM pg_proc \
             WHERE proname IN ('create_policy', 'alter_policy', 'create_policy_remote', 'alter_policy_remote') \
             GROUP BY proname ORDER BY proname",
            &[],
        )
        .expect("overloads")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let one = |name: &str| (name.to_string(), 1_i64);
    assert_eq!(
        overloads,
        [
            one("alter_policy"),
            one("alter_policy_remote"),
            one("create_policy"),
            one("create_policy_remote")
        ],
        "one signature of each, the current one"
    );
    // and a call by name with only the first arguments still resolves
    let name = fresh_name("after_old");
    r.execute(
        "SELECT rate_limit.create_policy($1, 5, '1 minute')",
        &[&name],
    )
    .expect("create_policy resolves to one function");
    r.execute("SELECT rate_limit.drop_policy($1)", &[&name])
        .expect("drop_policy");
}

/// A calendar quota made and changed through the router, with the arguments added in 0.4.0 by name: every
/// partition has it, and a key on either partition gets exactly its quota.
#[test]
fn a_calendar_quota_is_made_on_every_partition_through_the_router() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let policy = fresh_name("monthly");
    r.query(
        "SELECT rate_limit.create_policy($1, 2, '1 month', algorithm => 'calendar_window', \
           time_zone => 'europe/paris', anchor => '2026-01-15 00:00')",
        &[&policy],
    )
    .expect("create");
    r.query(
        "SELECT rate_limit.alter_policy($1, time_zone => 'Asia/Tokyo')",
        &[&policy],
    )
    .expect("alter");
    for server in &servers[1..] {
        let (zone, anchor): (String, String) = {
            let row = connect(server, PARTITION)
                .query_one(
                    "SELECT time_zone, anchor::text FROM rate_limit.policies WHERE name = $1",
                    &[&policy],
                )
                .expect("the policy is on every partition");
            (row.get(0), row.get(1))
        };
        assert_eq!(
            (zone.as_str(), anchor.as_str()),
            ("Asia/Tokyo", "2026-01-15 00:00:00")
        );
    }
    for key in [key_on(&mut r, 0, "c"), key_on(&mut r, 1, "d")] {
        let granted: i64 = r
            .query_one(
                "SELECT count(*) FILTER (WHERE (rate_limit.take($1, $2)).allowed) FROM generate_series(1, 3)",
                &[&policy, &key],
            )
            .expect("takes")
            .get(0);
        assert_eq!(granted, 2, "{key}: a quota of 2");
    }
}

/// A parent and its children made through the router on every partition: a call on a child takes from the
/// parent's bucket of its key on the key's partition, and the router keeps the family's SQLSTATEs.
#[test]
fn parent_policies_are_made_on_every_partition_and_shared_through_the_router() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let pool = fresh_name("pool");
    let (search, export) = (fresh_name("search"), fresh_name("export"));
    r.query(
        "SELECT rate_limit.create_policy($1, 10, '80 days')",
        &[&pool],
    )
    .expect("the parent");
    for child in [&search, &export] {
        r.query(
            "SELECT rate_limit.create_policy($1, 8, '80 days', \
             options => jsonb_build_object('parent', $2::text))",
            &[child, &pool],
        )
        .expect("a child");
    }
    for key in [key_on(&mut r, 0, "f"), key_on(&mut r, 1, "g")] {
        let take = |r: &mut Client, policy: &str, cost: i32| -> (bool, String) {
            let row = r
                .query_one(
                    "SELECT allowed, policy FROM rate_limit.take($1, $2, $3)",
                    &[&policy, &key, &cost],
                )
                .expect("take");
            (row.get(0), row.get(1))
        };
        assert_eq!(take(&mut r, &search, 6), (true, search.clone()), "{key}");
        // the pool has 4 left: export's 5 are denied by it
        assert_eq!(take(&mut r, &export, 5), (false, pool.clone()), "{key}");
        assert!(take(&mut r, &export, 4).0, "{key}");
        assert_eq!(take(&mut r, &search, 1), (false, pool.clone()), "{key}");
    }
    let e = r
        .query("SELECT rate_limit.drop_policy($1)", &[&pool])
        .expect_err("a parent with children");
    assert_eq!(code(&e), "2BP01");
}

/// Leases acquired and released through the router, on a key of each partition.
#[test]
fn leases_are_acquired_and_released_through_the_router() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let policy = fresh_name("jobs");
    r.query(
        "SELECT rate_limit.create_policy($1, 2, '1 hour', algorithm => 'concurrency')",
        &[&policy],
    )
    .expect("create");
    for key in [key_on(&mut r, 0, "e"), key_on(&mut r, 1, "f")] {
        let leases: Vec<Option<i64>> = (0..3)
            .map(|_| {
                r.query_one(
                    "SELECT lease FROM rate_limit.acquire($1, $2)",
                    &[&policy, &key],
                )
                .expect("acquire")
                .get(0)
            })
            .collect();
        assert!(
            leases[0].is_some() && leases[1].is_some() && leases[2].is_none(),
            "{key}"
        );
        let released: bool = r
            .query_one(
                "SELECT rate_limit.release($1, $2, $3)",
                &[&policy, &key, &leases[0]],
            )
            .expect("release")
            .get(0);
        assert!(released, "{key}");
    }
}

#[test]
fn a_key_hammered_through_the_router_is_exact_and_lives_on_its_partition() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let policy = fresh_name("hot");
    r.query(
        "SELECT rate_limit.create_policy($1, 20, '1 second', burst => 20)",
        &[&policy],
    )
    .expect("policy on every partition");
    let key = fresh_name("k");
    // half the connections take, half ask the scalar rate_limit.allow: both forwarded to the key's partition
    let caller = |i: usize| -> Caller {
        let mut c = connect(&servers[0], ROUTER);
        let (policy, key) = (policy.clone(), key.clone());
        let sql = if i.is_multiple_of(2) {
            "SELECT allowed FROM rate_limit.take($1, $2)"
        } else {
            "SELECT rate_limit.allow($1, $2)"
        };
        Box::new(move || {
            c.query_one(sql, &[&policy, &key])
                .expect("take through the router")
                .get(0)
        })
    };
    hammer_conserves_tokens(&mut r, (&policy, &key), (20, 20), 3, 8, caller);
    let home = partition_of(&mut r, &key);
    for (p, server) in servers[1..].iter().enumerate() {
        let n: i64 = connect(server, PARTITION)
            .query_one(
                "SELECT count(*) FROM rate_limit.buckets WHERE policy = $1 AND key = $2",
                &[&policy, &key],
            )
            .expect("buckets")
            .get(0);
        assert_eq!(n, i64::from(p == home), "partition {p} (the key's: {home})");
    }
}

#[test]
fn policies_are_managed_on_every_partition_and_statistics_merged() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let policy = fresh_name("managed");
    r.query(
        "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => 2)",
        &[&policy],
    )
    .expect("create");
    r.query("SELECT rate_limit.alter_policy($1, burst => 3)", &[&policy])
        .expect("alter");
    for server in &servers[1..] {
        let burst: i64 = connect(server, PARTITION)
            .query_one(
                "SELECT burst FROM rate_limit.policies WHERE name = $1",
                &[&policy],
            )
            .expect("the policy is on every partition")
            .get(0);
        assert_eq!(burst, 3);
    }
    // a key on each partition: 4 calls each, 3 granted, 1 denied
    let keys = [key_on(&mut r, 0, "a"), key_on(&mut r, 1, "b")];
    for key in &keys {
        for _ in 0..4 {
            r.query("SELECT * FROM rate_limit.take($1, $2)", &[&policy, key])
                .expect("take");
        }
    }
    let (calls, granted, denied): (i64, i64, i64) = {
        let row = r
            .query_one(
                "SELECT calls, granted, denied FROM rate_limit.stats WHERE policy = $1",
                &[&policy],
            )
            .expect("merged stats");
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!((calls, granted, denied), (8, 6, 2));
    // the partitions' backends that served the router hand their last denials over when they end:
    // reconnecting the router ends its cached connections only when they expire, so wait for the hand-over
    // (at most 100 ms after a denial, at the end of the backend's next transaction) by asking again
    let top = |r: &mut Client| -> Vec<(String, i64)> {
        r.query(
            "SELECT key, denials FROM rate_limit.top_limited WHERE policy = $1 ORDER BY key",
            &[&policy],
        )
        .expect("merged top")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
    };
    let want = vec![(keys[0].clone(), 1), (keys[1].clone(), 1)];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while top(&mut r) != want && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    assert_eq!(top(&mut r), want);
    let buckets: i64 = r
        .query_one(
            "SELECT count(*) FROM rate_limit.buckets WHERE policy = $1",
            &[&policy],
        )
        .expect("merged buckets")
        .get(0);
    assert_eq!(buckets, 2);
    let dropped: bool = r
        .query_one("SELECT rate_limit.drop_policy($1)", &[&policy])
        .expect("drop")
        .get(0);
    assert!(dropped);
    for server in &servers[1..] {
        let n: i64 = connect(server, PARTITION)
            .query_one(
                "SELECT count(*) FROM rate_limit.policies WHERE name = $1",
                &[&policy],
            )
            .expect("policies")
            .get(0);
        assert_eq!(n, 0, "dropped on every partition");
    }
}

#[test]
fn errors_keep_their_sqlstate_and_take_many_stays_on_one_partition() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let e = r
        .query("SELECT * FROM rate_limit.take('no such policy', 'k')", &[])
        .expect_err("unknown policy");
    assert_eq!(e.code(), Some(&SqlState::UNDEFINED_OBJECT), "{e:?}");
    let e = r
        .query("SELECT rate_limiting_request('k', 0, 60)", &[])
        .expect_err("bad rate");
    assert_eq!(e.code(), Some(&SqlState::INVALID_PARAMETER_VALUE), "{e:?}");
    let policy = fresh_name("many");
    r.query(
        "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => 1)",
        &[&policy],
    )
    .expect("policy");
    let (a, b) = (key_on(&mut r, 0, "a"), key_on(&mut r, 1, "b"));
    let e = r
        .query(
            "SELECT * FROM rate_limit.take_many(ARRAY[$1, $1], ARRAY[$2, $3])",
            &[&policy, &a, &b],
        )
        .expect_err("two partitions");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e:?}");
    let a2 = key_on(&mut r, 0, "a2_");
    let allowed: bool = r
        .query_one(
            "SELECT allowed FROM rate_limit.take_many(ARRAY[$1, $1], ARRAY[$2, $3])",
            &[&policy, &a, &a2],
        )
        .expect("one partition")
        .get(0);
    assert!(allowed);
}

#[test]
fn a_partition_down_fails_closed_or_open_as_the_router_chose() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let policy = fresh_name("down");
    r.query(
        "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => 1)",
        &[&policy],
    )
    .expect("policy");
    let (up, down) = (key_on(&mut r, 0, "up"), key_on(&mut r, 1, "down"));
    // drained before the stop: an "allowed" later can only come from failing open
    for key in [&up, &down] {
        r.query("SELECT * FROM rate_limit.take($1, $2)", &[&policy, key])
            .expect("take");
    }
    let take = |r: &mut Client, key: &str| -> Result<bool, postgres::Error> {
        r.query_one(
            "SELECT allowed FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .map(|row| row.get(0))
    };
    let allowed_while_down = |r: &mut Client| -> i64 {
        r.query_one(
            "SELECT allowed_while_down FROM rate_limit_router.status",
            &[],
        )
        .expect("status")
        .get(0)
    };
    let _down = StoppedServer::stop(
        "RATE_LIMIT_TEST_PLPROXY_PARTITION1_STOP",
        "RATE_LIMIT_TEST_PLPROXY_PARTITION1_START",
    );
    let mut r = connect(&servers[0], ROUTER);
    // fail_closed: 08006 for its keys, the other partition's keys answered as usual
    assert!(!take(&mut r, &up).expect("partition 0 serves"));
    let e = take(&mut r, &down).expect_err("fails closed");
    assert_eq!(e.code(), Some(&SqlState::CONNECTION_FAILURE), "{e:?}");
    let e = r
        .query("SELECT rate_limiting_request($1)", &[&down])
        .expect_err("fails closed");
    assert_eq!(e.code(), Some(&SqlState::CONNECTION_FAILURE), "{e:?}");
    let e = r
        .query("SELECT * FROM rate_limit.stats", &[])
        .expect_err("merged views need every partition");
    assert_eq!(e.code(), Some(&SqlState::CONNECTION_FAILURE), "{e:?}");

    // fail_open: the calls that take are allowed and counted; reads and the owner's calls still fail
    set_mode(&mut r, servers, "fail_open");
    let before = allowed_while_down(&mut r);
    assert!(take(&mut r, &down).expect("fails open"));
    let n: i32 = r
        .query_one("SELECT rate_limiting_request($1)", &[&down])
        .expect("fails open")
        .get(0);
    assert!(n >= 0, "allowed: {n}");
    assert!(!take(&mut r, &up).expect("partition 0 still limits"));
    // take_many names its first policy in the allowed answer; nothing is known of the bucket
    let row = r
        .query_one(
            "SELECT allowed, policy, remaining IS NULL, retry_after = interval '0' \
             FROM rate_limit.take_many(ARRAY[$1, $1], ARRAY[$2])",
            &[&policy, &down],
        )
        .expect("take_many fails open");
    assert_eq!(
        (
            row.get::<_, bool>(0),
            row.get::<_, String>(1),
            row.get::<_, bool>(2),
            row.get::<_, bool>(3)
        ),
        (true, policy.clone(), true, true)
    );
    assert_eq!(allowed_while_down(&mut r), before + 3);
    let e = r
        .query("SELECT * FROM rate_limit.peek($1, $2)", &[&policy, &down])
        .expect_err("reads fail closed");
    assert_eq!(e.code(), Some(&SqlState::CONNECTION_FAILURE), "{e:?}");
    let e = r
        .query("SELECT rate_limit.reset($1, $2)", &[&policy, &down])
        .expect_err("the owner's calls fail closed");
    assert_eq!(e.code(), Some(&SqlState::CONNECTION_FAILURE), "{e:?}");
    set_mode(&mut r, servers, "fail_closed");
}

#[test]
fn a_login_only_role_takes_through_the_router_and_is_refused_the_owners_calls() {
    let Some((_one, servers)) = router() else {
        return;
    };
    // roles are per server: the same role on the router's and on every partition's
    for server in servers {
        let mut admin = connect(server, "postgres");
        admin
            .batch_execute(
                "DO $$ BEGIN CREATE ROLE rl_router_user LOGIN; \
                 EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            )
            .expect("a LOGIN-only role");
    }
    let mut r = connect(&servers[0], ROUTER);
    let policy = fresh_name("public");
    r.query(
        "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => 1)",
        &[&policy],
    )
    .expect("policy");
    let down = key_on(&mut r, 1, "user_down");
    let mut user = Client::connect(
        &format!("{} dbname={ROUTER} user=rl_router_user", servers[0]),
        NoTls,
    )
    .expect("connect as the role");
    let take = |c: &mut Client, key: &str| -> Result<bool, postgres::Error> {
        c.query_one(
            "SELECT allowed FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .map(|row| row.get(0))
    };
    assert!(take(&mut user, &down).expect("the role takes through the router"));
    assert!(!take(&mut user, &down).expect("and is limited"));
    let e = user
        .query("SELECT rate_limit.reset($1, $2)", &[&policy, &down])
        .expect_err("the owner's call");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e:?}");
    let e = user
        .query("SELECT * FROM rate_limit.stats", &[])
        .expect_err("the owner's view");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e:?}");
    set_mode(&mut r, servers, "fail_open");
    {
        let _down = StoppedServer::stop(
            "RATE_LIMIT_TEST_PLPROXY_PARTITION1_STOP",
            "RATE_LIMIT_TEST_PLPROXY_PARTITION1_START",
        );
        let mut user = Client::connect(
            &format!("{} dbname={ROUTER} user=rl_router_user", servers[0]),
            NoTls,
        )
        .expect("connect as the role");
        assert!(take(&mut user, &down).expect("fails open for the role too"));
    }
    set_mode(&mut r, servers, "fail_closed");
}

/// The router's `calls()` are the surface's forwarded functions: the same names and argument types (of the
/// functions the router made), routed as the surface says, closed to PUBLIC where the surface's are.
#[test]
fn the_router_forwards_exactly_the_surfaces_forwarded_functions() {
    let Some((_one_at_a_time, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    let mut forwarded: Vec<(String, String, String, String)> = r
        .query(
            "SELECT c.name, pg_catalog.oidvectortypes(p.proargtypes), c.route, \
                    CASE c.kind WHEN 'owner' THEN 'owner' ELSE 'public' END \
             FROM rate_limit_router.calls() AS c \
             JOIN pg_proc p ON p.proname = c.name AND p.pronamespace = c.schema::regnamespace",
            &[],
        )
        .expect("calls")
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect();
    forwarded.sort();
    let mut expected: Vec<(String, String, String, String)> = functions()
        .filter(|f| f.route != Route::NotForwarded)
        .map(|f| {
            let route = match (f.route, f.key) {
                (Route::KeysPartition, Some(key)) => format!("pg_catalog.hashtext({key})"),
                (Route::FirstKeysPartition, _) => "rate_limit_router.first_key_hash(keys)".into(),
                (Route::EveryPartition, _) => "ALL".into(),
                (Route::AnyPartition, _) => "ANY".into(),
                (route, key) => panic!("{}: route {route:?} with key {key:?}", f.name),
            };
            let kind = if f.access == Access::Owner {
                "owner"
            } else {
                "public"
            };
            (
                f.name.to_string(),
                f.arguments.to_string(),
                route,
                kind.to_string(),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(forwarded, expected);
}

/// A partition frozen mid-flight (SIGSTOP) never hangs the router: with a timeout of 1 second, every call
/// that needs it ends well within 10 seconds (it hung for 627 s before, in PL/Proxy's blocking cancel
/// request), from a session whose connection to it was open and from a new one; with 08006 on a
/// fail_closed router, allowed on a fail_open one; the merged views fail with 08006 too. The other
/// partition serves meanwhile, and the frozen one is used again once it resumes.
#[test]
fn a_frozen_partition_ends_every_call_within_the_timeout() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    set_up(&mut r, servers, "fail_closed", "1 second");
    let policy = fresh_name("frozen");
    r.query(
        "SELECT rate_limit.create_policy($1, 1000, '1 hour')",
        &[&policy],
    )
    .expect("policy");
    let (up, frozen) = (key_on(&mut r, 0, "up"), key_on(&mut r, 1, "frozen"));
    let take = |c: &mut Client, key: &str| -> (Result<bool, postgres::Error>, f64) {
        let started = std::time::Instant::now();
        let answer = c
            .query_one(
                "SELECT allowed FROM rate_limit.take($1, $2)",
                &[&policy, &key],
            )
            .map(|row| row.get(0));
        (answer, started.elapsed().as_secs_f64())
    };
    // a session whose connection to the partition is open before it freezes
    let mut old = connect(&servers[0], ROUTER);
    assert!(take(&mut old, &frozen).0.expect("before the freeze"));
    let ice = FrozenServer::freeze("RATE_LIMIT_TEST_PLPROXY_PARTITION1_DATA");
    let mut new = connect(&servers[0], ROUTER);
    for (who, c) in [("old session", &mut old), ("new session", &mut new)] {
        for attempt in 1..=2 {
            let (answer, seconds) = take(c, &frozen);
            let e = answer.expect_err("fails closed");
            assert_eq!(
                e.code(),
                Some(&SqlState::CONNECTION_FAILURE),
                "{who} {attempt}: {e:?}"
            );
            assert!(seconds < 10.0, "{who} {attempt}: {seconds} s");
        }
        assert!(take(c, &up).0.expect("the other partition serves"), "{who}");
    }
    let started = std::time::Instant::now();
    let e = new
        .query("SELECT * FROM rate_limit.stats", &[])
        .expect_err("merged views need every partition");
    assert_eq!(e.code(), Some(&SqlState::CONNECTION_FAILURE), "{e:?}");
    assert!(started.elapsed().as_secs_f64() < 10.0);
    set_up(&mut new, servers, "fail_open", "1 second");
    let (answer, seconds) = take(&mut new, &frozen);
    assert!(answer.expect("fails open"), "allowed");
    assert!(seconds < 10.0, "{seconds} s");
    drop(ice);
    // resumed: used again (its backends may need a moment to answer what waited)
    set_mode(&mut new, servers, "fail_closed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match take(&mut old, &frozen).0 {
            Ok(allowed) => {
                assert!(allowed);
                break;
            }
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("the resumed partition is not used again: {e:?}"),
        }
    }
}

/// The deadline ends with what armed it: a forwarded call's block, a savepoint, a transaction (committed,
/// rolled back, or the one DISCARD ALL runs in). Before, `arm_deadline` (executable by PUBLIC) left a timer
/// that cancelled the session's next statement after COMMIT and DISCARD ALL: behind a pooler, another
/// client's. Checked as a role with only LOGIN.
#[test]
fn the_deadline_never_outlives_the_call_or_transaction_that_armed_it() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    set_up(&mut r, servers, "fail_closed", "300 milliseconds");
    ensure_role(servers, "rl_router_user");
    let mut user = Client::connect(
        &format!("{} dbname={ROUTER} user=rl_router_user", servers[0]),
        NoTls,
    )
    .expect("connect as the role");
    // each statement sent on its own (a simple-query batch would be one implicit transaction)
    let sleeps = |c: &mut Client, before: &[&str]| -> Result<(), postgres::Error> {
        for statement in before {
            c.batch_execute(statement)?;
        }
        c.batch_execute("SELECT pg_catalog.pg_sleep(0.6)")
    };
    let arm = "SELECT rate_limit_router.arm_deadline(300)";
    for (what, before) in [
        ("after a statement", vec![arm]),
        ("after COMMIT", vec!["BEGIN", arm, "COMMIT"]),
        ("after ROLLBACK", vec!["BEGIN", arm, "ROLLBACK"]),
        ("after DISCARD ALL", vec![arm, "DISCARD ALL"]),
    ] {
        sleeps(&mut user, &before).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    }
    // a savepoint's end, and a forwarded call's, end the deadline inside a transaction that goes on
    user.batch_execute(
        "BEGIN; SAVEPOINT s; SELECT rate_limit_router.arm_deadline(300); RELEASE SAVEPOINT s",
    )
    .expect("a savepoint");
    sleeps(&mut user, &[]).expect("after the savepoint's end");
    user.batch_execute("COMMIT").expect("commit");
    user.batch_execute("BEGIN").expect("begin");
    user.query(
        "SELECT rate_limiting_request($1)",
        &[&fresh_name("deadline")],
    )
    .expect("a forwarded call");
    sleeps(&mut user, &[]).expect("after a forwarded call in the same transaction");
    user.batch_execute("COMMIT").expect("commit");
    // and it does end a statement that outlives it
    let e = sleeps(&mut user, &["BEGIN", arm]).expect_err("the deadline of its own transaction");
    assert_eq!(e.code(), Some(&SqlState::LOCK_NOT_AVAILABLE), "{e:?}");
    user.batch_execute("ROLLBACK").expect("rollback");
    set_mode(&mut r, servers, "fail_closed");
}

/// The same role (LOGIN only) on the router's server and on every partition's.
fn ensure_role(servers: &[String], role: &str) {
    for server in servers {
        connect(server, "postgres")
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {role} LOGIN; \
                 EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            ))
            .expect("a LOGIN-only role");
    }
}

/// A role connected straight to a partition holds a key's row (a take in a transaction it leaves open).
/// Through the router, the key's calls end at the partition's own lock timeout (half the router's) with
/// 55P03 and nothing taken, on a fail_open router as on a fail_closed one: a locked key is never an
/// "allowed", nor counted as one. None of them is left waiting on the partition, and once the role rolls
/// back the key holds what it held before: the calls the router gave up on were given up there too.
#[test]
fn a_key_held_on_its_partition_is_never_allowed_and_is_given_up_there_too() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    ensure_role(servers, "rl_router_user");
    let policy = fresh_name("held");
    r.query(
        "SELECT rate_limit.create_policy($1, 1, '1 day', burst => 2, store => 'table')",
        &[&policy],
    )
    .expect("policy");
    let key = key_on(&mut r, 1, "held");
    let partition = format!("{} dbname={PARTITION}", servers[2]);
    let mut holder = Client::connect(&format!("{partition} user=rl_router_user"), NoTls)
        .expect("a role on the partition");
    let mut watcher = Client::connect(&partition, NoTls).expect("the owner on the partition");
    let allowed_while_down = |r: &mut Client| -> i64 {
        r.query_one(
            "SELECT allowed_while_down FROM rate_limit_router.status",
            &[],
        )
        .expect("status")
        .get(0)
    };
    for mode in ["fail_open", "fail_closed"] {
        set_up(&mut r, servers, mode, "1 second");
        let before = allowed_while_down(&mut r);
        holder.batch_execute("BEGIN").expect("begin");
        let remaining: i64 = holder
            .query_one(
                "SELECT remaining FROM rate_limit.take($1, $2)",
                &[&policy, &key],
            )
            .expect("the holder takes one of two")
            .get(0);
        assert_eq!(remaining, 1, "{mode}");
        let mut user = Client::connect(
            &format!("{} dbname={ROUTER} user=rl_router_user", servers[0]),
            NoTls,
        )
        .expect("connect as the role");
        for attempt in 1..=4 {
            let started = std::time::Instant::now();
            let e = user
                .query_one(
                    "SELECT allowed FROM rate_limit.take($1, $2)",
                    &[&policy, &key],
                )
                .expect_err("the key is held");
            assert_eq!(
                e.code(),
                Some(&SqlState::LOCK_NOT_AVAILABLE),
                "{mode} {attempt}: {e:?}"
            );
            let hint = e.as_db_error().and_then(|d| d.hint()).unwrap_or_default();
            assert!(hint.starts_with("Nothing was granted"), "{mode}: {hint}");
            assert!(started.elapsed().as_secs_f64() < 5.0, "{mode} {attempt}");
        }
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("activity")
            .get(0);
        assert_eq!(waiting, 0, "{mode}: calls left waiting on the partition");
        holder.batch_execute("ROLLBACK").expect("rollback");
        let left: i64 = watcher
            .query_one(
                "SELECT remaining FROM rate_limit.peek($1, $2)",
                &[&policy, &key],
            )
            .expect("peek")
            .get(0);
        assert_eq!(left, 2, "{mode}: a call the router gave up on took a token");
        assert_eq!(
            allowed_while_down(&mut r),
            before,
            "{mode}: counted as allowed"
        );
    }
    set_mode(&mut r, servers, "fail_closed");
}

/// What a role creates to hijack the router's functions, in schema `s` (its own schema placed before
/// pg_catalog, or `public` where PostgreSQL 13 and 14 let every role create): look-alike operators,
/// functions, aggregates, a `text` domain, tables and a sequence, every one of which records that it ran
/// (and as whom) in `s.hijacked`, which every role may write. Types and operators take `text`, `int4` and
/// `int8`, the types the router's functions compare and combine.
fn look_alikes(s: &str) -> String {
    format!(
        r#"
CREATE TABLE {s}.hijacked (who name, what text);
GRANT INSERT ON {s}.hijacked TO PUBLIC;
CREATE FUNCTION {s}.t_yes(text, text) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'text op'); SELECT true $$;
CREATE FUNCTION {s}.i_yes(int4, int4) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'int op'); SELECT true $$;
CREATE FUNCTION {s}.i_zero(int4, int4) RETURNS int4 LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'int arith'); SELECT 0 $$;
CREATE FUNCTION {s}.t_cat(text, text) RETURNS text LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, '||'); SELECT 'x' $$;
CREATE OPERATOR {s}.= (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.t_yes);
CREATE OPERATOR {s}.~ (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.t_yes);
CREATE OPERATOR {s}.!~ (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.t_yes);
CREATE OPERATOR {s}.~* (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.t_yes);
CREATE OPERATOR {s}.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.t_cat);
CREATE OPERATOR {s}.= (LEFTARG = int4, RIGHTARG = int4, FUNCTION = {s}.i_yes);
CREATE FUNCTION {s}.l_yes(int8, int4) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'bigint op'); SELECT true $$;
CREATE OPERATOR {s}.> (LEFTARG = int8, RIGHTARG = int4, FUNCTION = {s}.l_yes);
CREATE OPERATOR {s}.> (LEFTARG = int4, RIGHTARG = int4, FUNCTION = {s}.i_yes);
CREATE OPERATOR {s}.& (LEFTARG = int4, RIGHTARG = int4, FUNCTION = {s}.i_zero);
CREATE OPERATOR {s}.* (LEFTARG = int4, RIGHTARG = int4, FUNCTION = {s}.i_zero);
CREATE OPERATOR {s}./ (LEFTARG = int4, RIGHTARG = int4, FUNCTION = {s}.i_zero);
CREATE FUNCTION {s}.nextval(text) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'nextval(text)'); SELECT 0::bigint $$;
CREATE FUNCTION {s}.nextval(regclass) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'nextval(regclass)'); SELECT 0::bigint $$;
CREATE FUNCTION {s}.hashtext(text) RETURNS int4 LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'hashtext'); SELECT 0 $$;
CREATE FUNCTION {s}.unnest(text[]) RETURNS SETOF text LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'unnest'); SELECT 'same' $$;
CREATE FUNCTION {s}.greatest_of(int4, int4) RETURNS int4 LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'aggregate'); SELECT 0 $$;
CREATE AGGREGATE {s}.count(int4) (SFUNC = {s}.greatest_of, STYPE = int4, INITCOND = '0');
CREATE FUNCTION {s}.or_of(boolean, boolean) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'bool_or'); SELECT true $$;
CREATE AGGREGATE {s}.bool_or(boolean) (SFUNC = {s}.or_of, STYPE = boolean);
CREATE FUNCTION {s}.clock_timestamp() RETURNS timestamptz LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'clock'); SELECT timestamptz '2999-01-01' $$;
CREATE FUNCTION {s}.to_regprocedure(text) RETURNS regprocedure LANGUAGE sql
    AS $$ INSERT INTO {s}.hijacked VALUES (current_user, 'to_regprocedure'); SELECT NULL::regprocedure $$;
CREATE DOMAIN {s}.text AS pg_catalog.varchar(1);
CREATE TABLE {s}.settings (one boolean, cluster text, partitions int, on_partition_down text, timeout interval);
CREATE SEQUENCE {s}.allowed_while_down;
"#
    )
}

/// Every router function a role with only LOGIN may execute, with keys prefixed by `p` (and `split`, two
/// keys of different partitions, for a take_many the router refuses), and each answer as text: the calls that take, read and combine, on keys of both partitions; the router's own helpers
/// (its deadline, its routing hash, how it reads a failure).
fn router_scenario(
    c: &mut Client,
    p: &str,
    policy: &str,
    leases: &str,
    split: &(String, String),
) -> Vec<String> {
    let mut out = Vec::new();
    let mut row = |sql: &str| {
        let sql = sql
            .replace("{p}", p)
            .replace("{policy}", policy)
            .replace("{leases}", leases)
            .replace("{s0}", &split.0)
            .replace("{s1}", &split.1);
        out.push(
            match c.query_one(&format!("SELECT ({sql})::pg_catalog.text"), &[]) {
                Ok(r) => r
                    .get::<_, Option<String>>(0)
                    .unwrap_or_else(|| "NULL".into()),
                Err(e) => format!("error {}", e.code().map(|c| c.code()).unwrap_or("?")),
            },
        );
    };
    row("SELECT public.rate_limiting_request('{p}r', 1, 10)");
    row("SELECT public.rate_limiting_request('{p}r', 1, 10)");
    row("SELECT rate_limit.peek_request('{p}r', 1, 10)");
    row("SELECT pg_catalog.floor(rate_limit.tokens('{p}r', 1, 10))");
    for key in ["{p}a", "{p}b", "{p}c", "{p}d"] {
        row(&format!("SELECT (allowed, remaining, \"limit\", policy) FROM rate_limit.take('{{policy}}', '{key}')"));
        row(&format!("SELECT (allowed, remaining, \"limit\", policy) FROM rate_limit.take('{{policy}}', '{key}')"));
        row(&format!(
            "SELECT (allowed, remaining) FROM rate_limit.peek('{{policy}}', '{key}')"
        ));
        row(&format!("SELECT (allowed, remaining) FROM rate_limit.wait('{{policy}}', '{key}', 1, '0 seconds')"));
        row(&format!(
            "SELECT (allowed, remaining) FROM rate_limit.take_ad_hoc('{key}', 1, '1 hour', 2)"
        ));
    }
    row("SELECT (allowed, policy) FROM rate_limit.take_many(ARRAY['{policy}', '{policy}'], ARRAY['{s0}', '{s1}'])");
    row("SELECT (allowed, policy) FROM rate_limit.take_many(ARRAY['{policy}'], ARRAY['{p}m'])");
    row("SELECT rate_limit.headers(d) FROM rate_limit.take('{policy}', '{p}h') AS d");
    row("SELECT (allowed, remaining, lease IS NOT NULL) FROM rate_limit.acquire('{leases}', '{p}l')");
    row("SELECT rate_limit_router.first_key_hash(ARRAY['same for all'])");
    row("SELECT rate_limit_router.combined('purge')");
    row("SELECT pg_catalog.count(*) FROM rate_limit_router.calls()");
    row("SELECT rate_limit_router.arm_deadline(60000)");
    row("SELECT rate_limit_router.disarm_deadline()");
    row("SELECT rate_limit_router.forwarding_failed('m', '22012', true)");
    row("SELECT rate_limit_router.forwarding_failed('PL/Proxy function f(1): [d] PQconnectPoll: no', 'XX000', false)");
    row("SELECT rate_limit_router.forwarding_failed('f(1): [d] REMOTE ERROR: canceling statement due to lock timeout', '55P03', true)");
    row("SELECT (rate_limit_router.take_remote('{policy}', '{p}z', 1)).allowed");
    out
}

/// No caller's search_path changes what a router function does: a role with only LOGIN creates look-alike
/// operators, functions, aggregates, a domain, tables and a sequence, in a schema of its own before
/// pg_catalog and in `public` (PostgreSQL 13 and 14 let every role create there; later versions are given
/// that default back for the test), and temporary tables in pg_temp, then calls every router function it
/// may execute, from a fresh backend, with each search_path; also on a fail_open router while a partition
/// is down (the path that counts allowed calls, which used to run SECURITY DEFINER with the caller's
/// operators). Every answer equals a clean session's, and no look-alike ever ran, as anyone.
#[test]
fn router_functions_ignore_every_look_alike_on_the_search_path() {
    let Some((_one, servers)) = router() else {
        return;
    };
    let mut r = connect(&servers[0], ROUTER);
    set_mode(&mut r, servers, "fail_closed");
    ensure_role(servers, "rl_router_evil");
    ensure_role(servers, "rl_router_user");
    // the clean sessions are another role with only LOGIN, without look-alikes
    let clean_session = || {
        Client::connect(
            &format!("{} dbname={ROUTER} user=rl_router_user", servers[0]),
            NoTls,
        )
        .expect("connect as a clean role")
    };
    let policy = fresh_name("hijack");
    let leases = fresh_name("hijack_leases");
    r.batch_execute(&format!(
        "SELECT rate_limit.create_policy('{policy}', 1, '1 hour', burst => 1);
         SELECT rate_limit.create_policy('{leases}', 1, '1 hour', algorithm => 'concurrency');
         DROP SCHEMA IF EXISTS evil CASCADE;
         CREATE SCHEMA evil AUTHORIZATION rl_router_evil;
         GRANT CREATE ON SCHEMA public TO PUBLIC;"
    ))
    .expect("policies, and the schemas a role may create in");
    let mut evil = Client::connect(
        &format!("{} dbname={ROUTER} user=rl_router_evil", servers[0]),
        NoTls,
    )
    .expect("connect as the role");
    for schema in ["evil", "public"] {
        evil.batch_execute(&look_alikes(schema))
            .unwrap_or_else(|e| panic!("look-alikes in {schema}: {e:?}"));
    }
    let split = (key_on(&mut r, 0, "split"), key_on(&mut r, 1, "split"));
    let clean = router_scenario(&mut clean_session(), "c", &policy, &leases, &split);
    // the clean answers are the right ones: a drained key is denied, keys of two partitions refused
    assert_eq!(clean[0..4], ["9", "8", "8", "8"], "{clean:?}");
    assert_eq!(clean[4], "(t,0,1,{policy})".replace("{policy}", &policy));
    assert_eq!(clean[5], "(f,0,1,{policy})".replace("{policy}", &policy));
    for (i, path) in [
        "evil, pg_catalog, public",
        "pg_temp, evil, pg_catalog",
        "\"$user\", public",
        "public, pg_catalog",
    ]
    .iter()
    .enumerate()
    {
        let mut attacker = Client::connect(
            &format!("{} dbname={ROUTER} user=rl_router_evil", servers[0]),
            NoTls,
        )
        .expect("a fresh backend");
        attacker
            .batch_execute(&format!(
                "CREATE TEMP TABLE settings (one boolean, cluster text, partitions int, \
                   on_partition_down text, timeout interval);
                 CREATE TEMP TABLE calls (name text);
                 CREATE TEMP SEQUENCE allowed_while_down;
                 SET search_path = {path}"
            ))
            .expect("temporary look-alikes and the search_path");
        let hijacked = router_scenario(&mut attacker, &format!("c{i}"), &policy, &leases, &split);
        let clean_again = router_scenario(
            &mut clean_session(),
            &format!("d{i}"),
            &policy,
            &leases,
            &split,
        );
        assert_eq!(clean_again, clean, "two clean sessions agree");
        assert_eq!(
            hijacked, clean,
            "search_path {path}: the look-alikes changed an answer"
        );
    }
    // fail_open with a partition down: the calls that take are allowed and counted, as the caller
    set_mode(&mut r, servers, "fail_open");
    let before: i64 = r
        .query_one(
            "SELECT allowed_while_down FROM rate_limit_router.status",
            &[],
        )
        .expect("status")
        .get(0);
    {
        let _down = StoppedServer::stop(
            "RATE_LIMIT_TEST_PLPROXY_PARTITION1_STOP",
            "RATE_LIMIT_TEST_PLPROXY_PARTITION1_START",
        );
        let down = key_on(&mut r, 1, "hijack_down");
        for path in [
            "evil, pg_catalog, public",
            "public, pg_catalog",
            "\"$user\", public",
        ] {
            let mut attacker = Client::connect(
                &format!("{} dbname={ROUTER} user=rl_router_evil", servers[0]),
                NoTls,
            )
            .expect("a fresh backend");
            attacker
                .batch_execute(&format!("SET search_path = {path}"))
                .expect("search_path");
            let allowed: bool = attacker
                .query_one(
                    "SELECT allowed FROM rate_limit.take($1, $2)",
                    &[&policy, &down],
                )
                .expect("allowed while down")
                .get(0);
            assert!(allowed, "{path}");
        }
    }
    let after: i64 = r
        .query_one(
            "SELECT allowed_while_down FROM rate_limit_router.status",
            &[],
        )
        .expect("status")
        .get(0);
    assert_eq!(after, before + 3, "each allowed call counted once");
    set_mode(&mut r, servers, "fail_closed");
    for schema in ["evil", "public"] {
        let ran: Vec<(String, String)> = r
            .query(
                &format!("SELECT who::text, what FROM {schema}.hijacked"),
                &[],
            )
            .expect("the record")
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        assert_eq!(
            ran,
            Vec::<(String, String)>::new(),
            "look-alikes in {schema} ran"
        );
    }
    r.batch_execute(
        "DROP SCHEMA evil CASCADE;
         DROP TABLE public.hijacked; DROP SEQUENCE public.allowed_while_down; DROP TABLE public.settings;
         DROP AGGREGATE public.count(int4); DROP AGGREGATE public.bool_or(boolean);
         DROP DOMAIN public.text;
         DROP FUNCTION public.t_yes, public.i_yes, public.l_yes, public.i_zero, public.t_cat, public.nextval(text),
           public.nextval(regclass), public.hashtext, public.unnest, public.greatest_of,
           public.or_of, public.clock_timestamp, public.to_regprocedure CASCADE;
         REVOKE CREATE ON SCHEMA public FROM PUBLIC;",
    )
    .expect("clean up");
}
