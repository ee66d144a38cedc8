//! The memory store closed to abuse, tried as a role with only LOGIN would:
//! - a flood of new keys from one database fills only that database's share (`rate_limit.database_share`,
//!   50% by default) of the server's memory store, under both `rate_limit.on_full` settings: another
//!   database's new keys still get exactly their limits, and its drained key stays drained (nothing of it
//!   was evicted or reset). Each refusal is 53200 naming the share, with a hint that does not recommend
//!   `evict_oldest` (small server: 256 buckets in 4 partitions, so the flood is quick);
//! - limits that would take longer than `rate_limit.max_refill_time` to refill are refused with 22023 for
//!   such a role (they could never be purged), and accepted for the extension's owner.

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use rate_limit_integration::{conninfo, env, memory_usage as usage, TestDb};

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
    for store in ["table", "memory"] {
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
