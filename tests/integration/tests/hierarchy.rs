//! Hierarchical quotas (policy option `parent`) against a real server, in every store of the edition under
//! test. A tenant's key shares one parent bucket, `tenant`, among its child policies `search` and
//! `export`, each capped by its own numbers:
//! - exact values: a call on a child takes from its bucket and its parent's of the same key, all or
//!   nothing; the decision names whichever level decided and reports the tighter; another key is
//!   untouched; `take_many`, `peek`, `allow`, `charge`, `refund`, `reserve` and `settle` (one policy or
//!   several) each count the parent as `take` does;
//! - from 16 connections over three children that all want more than the parent holds, the parent grants
//!   exactly its burst and no child more than its own;
//! - an override of the parent for one key sets that tenant's pool; a role with only LOGIN calls the
//!   children and cannot name, change or drop a parent (42501);
//! - every misuse of `parent` gets its SQLSTATE (no parent, itself, two levels, leases, two stores, a
//!   seventeenth child, a drop that would orphan children, a call that does not take from a parent yet).

use std::thread;

use postgres::Client;
use rate_limit_integration::{stores, TestDb};

/// Nothing refills while a test runs: every bucket's rate is its burst per 1000 days.
const PER: &str = "1000 days";

/// A database with parent `tenant` (burst 10) and children `search` and `export` (burst 6 each), in
/// `store`.
fn family(name: &str, store: &str) -> TestDb {
    let db = TestDb::new(&format!("family_{name}_{store}"));
    let mut c = db.connect();
    create(&mut c, "tenant", 10, store, None);
    create(&mut c, "search", 6, store, Some("tenant"));
    create(&mut c, "export", 6, store, Some("tenant"));
    db
}

/// Creates policy `name`, `burst` tokens per [`PER`] with max_debt 1000, in `store`, under `parent`.
fn create(c: &mut Client, name: &str, burst: i64, store: &str, parent: Option<&str>) {
    c.batch_execute("SET rate_limit.max_policy_refill_time = '200000d'")
        .expect("raise the bound");
    c.execute(
        "SELECT rate_limit.create_policy($1, $2, $3::text::interval, max_debt => 1000, store => $4, \
         options => CASE WHEN $5::text IS NULL THEN NULL ELSE jsonb_build_object('parent', $5::text) END)",
        &[&name, &burst, &PER, &store, &parent],
    )
    .unwrap_or_else(|e| panic!("create policy {name}: {e:?}"));
}

/// A decision as (allowed, remaining, limit, policy).
type Decided = (bool, i64, i64, String);

/// Runs `sql` (a call returning a decision) and reads it.
fn decided(c: &mut Client, sql: &str) -> Decided {
    let row = c
        .query_one(
            &format!("SELECT d.allowed, d.remaining, d.\"limit\", d.policy FROM {sql} AS d"),
            &[],
        )
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// The tokens `policy`'s bucket of `key` holds (whole), its burst when it has none.
fn left(c: &mut Client, policy: &str, key: &str) -> i64 {
    c.query_one(
        "SELECT coalesce((SELECT floor(tokens)::bigint FROM rate_limit.buckets \
                          WHERE policy = $1 AND key = $2 AND algorithm <> 'reservation'), \
                         (SELECT burst FROM rate_limit.policies WHERE name = $1))",
        &[&policy, &key],
    )
    .expect("buckets")
    .get(0)
}

/// What `tenant`, `search` and `export` hold for `key`.
fn all_left(c: &mut Client, key: &str) -> (i64, i64, i64) {
    (
        left(c, "tenant", key),
        left(c, "search", key),
        left(c, "export", key),
    )
}

fn d(allowed: bool, remaining: i64, limit: i64, policy: &str) -> Decided {
    (allowed, remaining, limit, policy.to_string())
}

fn exact_values(store: &str) {
    let db = family("exact", store);
    let mut c = db.connect();
    // the child is the tighter: it decides
    assert_eq!(
        decided(&mut c, "rate_limit.take('search', 'k', 5)"),
        d(true, 1, 6, "search"),
        "{store}"
    );
    assert_eq!(all_left(&mut c, "k"), (5, 1, 6), "{store}");
    // the parent is the tighter
    assert_eq!(
        decided(&mut c, "rate_limit.take('export', 'k', 4)"),
        d(true, 1, 10, "tenant"),
        "{store}"
    );
    assert_eq!(all_left(&mut c, "k"), (1, 1, 2), "{store}");
    // export holds 2, its parent 1: denied by the parent, and export keeps its tokens
    let (allowed, _, _, policy) = decided(&mut c, "rate_limit.take('export', 'k', 2)");
    assert_eq!((allowed, policy.as_str()), (false, "tenant"), "{store}");
    assert_eq!(all_left(&mut c, "k"), (1, 1, 2), "{store}");
    // a report (cost 0) takes nothing; on a tie the child is named
    assert_eq!(
        decided(&mut c, "rate_limit.peek('search', 'k')"),
        d(true, 1, 6, "search"),
        "{store}"
    );
    let allowed: bool = c
        .query_one("SELECT rate_limit.allow('search', 'k', 1)", &[])
        .expect("allow")
        .get(0);
    assert!(allowed, "{store}");
    assert_eq!(all_left(&mut c, "k"), (0, 0, 2), "{store}");
    // another key has buckets of its own at every level
    assert_eq!(
        decided(&mut c, "rate_limit.take('search', 'other', 6)"),
        d(true, 0, 6, "search"),
        "{store}"
    );
    assert_eq!(all_left(&mut c, "other"), (4, 0, 6), "{store}");
    // refund and charge count every level, each within its own numbers
    decided(&mut c, "rate_limit.refund('search', 'other', 3)");
    assert_eq!(all_left(&mut c, "other"), (7, 3, 6), "{store}");
    decided(&mut c, "rate_limit.charge('export', 'other', 8)");
    assert_eq!(all_left(&mut c, "other"), (-1, 3, -2), "{store}");
    // take_many: the parent of each (policy, key) too; one bucket named twice is refused
    assert_eq!(
        decided(
            &mut c,
            "rate_limit.take_many(ARRAY['search', 'export'], ARRAY['x', 'y'], 2)"
        ),
        d(true, 4, 6, "search"),
        "{store}"
    );
    assert_eq!(all_left(&mut c, "x"), (8, 4, 6), "{store}");
    assert_eq!(all_left(&mut c, "y"), (8, 6, 4), "{store}");
    // reserve and settle: the estimate is held at both levels, and the settle gives back to both
    let row = c
        .query_one(
            "SELECT allowed, lease FROM rate_limit.reserve('search', 'r', 5)",
            &[],
        )
        .expect("reserve");
    let (allowed, id): (bool, Option<i64>) = (row.get(0), row.get(1));
    assert!(allowed, "{store}");
    let id = id.expect("an id");
    assert_eq!(all_left(&mut c, "r"), (5, 1, 6), "{store}");
    let settled: bool = c
        .query_one(
            "SELECT allowed FROM rate_limit.settle('search', 'r', $1, 2)",
            &[&id],
        )
        .expect("settle")
        .get(0);
    assert!(settled, "{store}");
    assert_eq!(all_left(&mut c, "r"), (8, 4, 6), "{store}");
    let again: bool = c
        .query_one(
            "SELECT allowed FROM rate_limit.settle('search', 'r', $1, 0)",
            &[&id],
        )
        .expect("settle again")
        .get(0);
    assert!(!again, "{store}: once");
    // reserve_many and settle_many: a child's parent too
    let row = c
        .query_one(
            "SELECT allowed, lease FROM rate_limit.reserve_many(ARRAY['export'], 'r', ARRAY[3])",
            &[],
        )
        .expect("reserve_many");
    let id: i64 = row.get::<_, Option<i64>>(1).expect("an id");
    assert_eq!(all_left(&mut c, "r"), (5, 4, 3), "{store}");
    c.query_one(
        "SELECT rate_limit.settle_many(ARRAY['export'], 'r', $1, ARRAY[1])",
        &[&id],
    )
    .expect("settle_many");
    assert_eq!(all_left(&mut c, "r"), (7, 4, 5), "{store}");
}

#[test]
fn a_child_takes_from_its_parent_all_or_nothing_and_the_tighter_level_decides() {
    for store in stores() {
        exact_values(store);
    }
}

/// A tenant's own pool (an override of the parent for its key) and a role with only LOGIN: it calls the
/// children, and can neither give a policy a parent nor take one away.
fn overrides_and_roles(store: &str) {
    let db = family("override", store);
    let mut c = db.connect();
    c.batch_execute(
        "SET rate_limit.max_policy_refill_time = '200000d'; \
         SELECT rate_limit.set_override('tenant', 'vip', rate => 20, burst => 20)",
    )
    .expect("a bigger pool for vip");
    let mut role = db.connect_as_login_role("rl_family");
    let take = |c: &mut Client, policy: &str, key: &str| -> (bool, String) {
        let row = c
            .query_one(
                "SELECT allowed, policy FROM rate_limit.take($1, $2, 6)",
                &[&policy, &key],
            )
            .expect("take");
        (row.get(0), row.get(1))
    };
    // the pool of 10: export's 6 after search's 6 are denied by it
    assert_eq!(
        take(&mut role, "search", "k"),
        (true, "search".into()),
        "{store}"
    );
    assert_eq!(
        take(&mut role, "export", "k"),
        (false, "tenant".into()),
        "{store}"
    );
    // vip's pool of 20: both children's 6
    assert_eq!(
        take(&mut role, "search", "vip"),
        (true, "search".into()),
        "{store}"
    );
    assert_eq!(
        take(&mut role, "export", "vip"),
        (true, "export".into()),
        "{store}"
    );
    assert_eq!(all_left(&mut c, "vip"), (8, 0, 0), "{store}");
    for sql in [
        "SELECT rate_limit.create_policy('mine', 100, '1 hour', options => '{\"parent\": \"tenant\"}')",
        "SELECT rate_limit.alter_policy('search', options => '{\"parent\": null}')",
        "SELECT rate_limit.drop_policy('tenant')",
    ] {
        let e = role.batch_execute(sql).expect_err("the owner's");
        assert_eq!(
            e.code().map(|s| s.code()),
            Some("42501"),
            "{store}: {sql}"
        );
    }
}

#[test]
fn a_tenants_override_of_the_parent_sets_its_pool_and_only_the_owner_names_parents() {
    for store in stores() {
        overrides_and_roles(store);
    }
}

/// 16 connections over children `a`, `b` and `c` (burst 60 each) of `pool` (burst 100), each asking for
/// one token until its child is denied 20 times in a row: the parent grants exactly its 100 tokens, and
/// no child more than its 60.
fn sixteen_connections(store: &str) {
    let db = TestDb::new(&format!("family_sixteen_{store}"));
    let mut c = db.connect();
    create(&mut c, "pool", 100, store, None);
    for child in ["a", "b", "c"] {
        create(&mut c, child, 60, store, Some("pool"));
    }
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let mut c = db.connect();
            let child = ["a", "b", "c"][i % 3];
            thread::spawn(move || {
                let (mut granted, mut denied_in_a_row) = (0i64, 0);
                while denied_in_a_row < 20 {
                    let allowed: bool = c
                        .query_one("SELECT allowed FROM rate_limit.take($1, 'k')", &[&child])
                        .expect("take")
                        .get(0);
                    if allowed {
                        granted += 1;
                        denied_in_a_row = 0;
                    } else {
                        denied_in_a_row += 1;
                    }
                }
                (child, granted)
            })
        })
        .collect();
    let mut by_child = [0i64; 3];
    for h in handles {
        let (child, granted) = h.join().expect("a connection");
        by_child[["a", "b", "c"]
            .iter()
            .position(|&n| n == child)
            .unwrap_or(0)] += granted;
    }
    assert_eq!(by_child.iter().sum::<i64>(), 100, "{store}: {by_child:?}");
    assert!(by_child.iter().all(|&g| g <= 60), "{store}: {by_child:?}");
    assert_eq!(left(&mut c, "pool", "k"), 0, "{store}");
    for (i, child) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(
            left(&mut c, child, "k"),
            60 - by_child[i],
            "{store}: {child}"
        );
    }
}

#[test]
fn a_parent_grants_exactly_its_burst_to_children_under_16_connections() {
    for store in stores() {
        sixteen_connections(store);
    }
}

fn misuse(store: &str) {
    let db = family("misuse", store);
    let mut c = db.connect();
    let state = |c: &mut Client, sql: &str| -> String {
        c.batch_execute(sql)
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| e.code().map_or("none".into(), |s| s.code().to_string()))
    };
    let create = |parent: &str, extra: &str| {
        format!(
            "SELECT rate_limit.create_policy('new', 5, '1 hour', store => '{store}'{extra}, \
             options => '{{\"parent\": {parent}}}')"
        )
    };
    let cases = [
        (create("\"nope\"", ""), "42704"),
        (create("\"bad name!\"", ""), "22023"),
        (create("5", ""), "22023"),
        (create("\"new\"", ""), "22023"),
        // a child cannot be a parent: one level
        (create("\"search\"", ""), "22023"),
        // a concurrency policy can be neither
        (
            create("\"tenant\"", ", algorithm => 'concurrency'"),
            "42809",
        ),
        (
            "SELECT rate_limit.alter_policy('tenant', algorithm => 'concurrency', max_debt => 0, per => '1 hour')"
                .to_string(),
            "42809",
        ),
        // a parent cannot get a parent of its own
        (
            "SELECT rate_limit.alter_policy('tenant', options => '{\"parent\": \"search\"}')"
                .to_string(),
            "22023",
        ),
        // a parent with children cannot be dropped
        (
            "SELECT rate_limit.drop_policy('tenant')".to_string(),
            "2BP01",
        ),
        // calls that do not take from a parent yet
        (
            "SELECT * FROM rate_limit.take_batch('search', ARRAY['a', 'b'])".to_string(),
            "0A000",
        ),
        (
            "SELECT rate_limit.book('search', 'k', 1)".to_string(),
            "0A000",
        ),
        // one bucket named twice: a child's parent counts
        (
            "SELECT rate_limit.take_many(ARRAY['search', 'tenant'], ARRAY['k'])".to_string(),
            "22023",
        ),
        (
            "SELECT rate_limit.take_many(ARRAY['search', 'export'], ARRAY['k'])".to_string(),
            "22023",
        ),
        (
            "SELECT rate_limit.reserve_many(ARRAY['search', 'export'], 'k', ARRAY[1])".to_string(),
            "22023",
        ),
    ];
    for (sql, expected) in &cases {
        assert_eq!(&state(&mut c, sql), expected, "{store}: {sql}");
    }
    // nothing of it changed a bucket
    assert_eq!(all_left(&mut c, "k"), (10, 6, 6), "{store}");
    if stores().len() > 1 {
        let other = if store == "table" { "memory" } else { "table" };
        assert_eq!(
            state(
                &mut c,
                &format!(
                    "SELECT rate_limit.create_policy('elsewhere', 5, '1 hour', store => '{other}', \
                     options => '{{\"parent\": \"tenant\"}}')"
                )
            ),
            "0A000",
            "{store}"
        );
    }
    // at most 16 children
    for i in 3..=16 {
        create_child(&mut c, &format!("child{i}"), store);
    }
    assert_eq!(
        state(&mut c, &create("\"tenant\"", "")),
        "22023",
        "{store}: a seventeenth child"
    );
    // a child may leave its parent, and a parent without children may be dropped
    for name in ["search", "export"] {
        c.batch_execute(&format!(
            "SELECT rate_limit.alter_policy('{name}', options => '{{\"parent\": null}}')"
        ))
        .expect("leave the parent");
    }
    for i in 3..=16 {
        c.batch_execute(&format!("SELECT rate_limit.drop_policy('child{i}')"))
            .expect("drop a child");
    }
    assert_eq!(
        state(&mut c, "SELECT rate_limit.drop_policy('tenant')"),
        "ok",
        "{store}"
    );
    // search left its parent: it takes from its own bucket alone
    assert_eq!(
        decided(&mut c, "rate_limit.take('search', 'k', 6)"),
        (true, 0, 6, "search".to_string()),
        "{store}"
    );
}

/// Creates a child of `tenant` called `name` in `store`.
fn create_child(c: &mut Client, name: &str, store: &str) {
    create(c, name, 6, store, Some("tenant"));
}

#[test]
fn every_misuse_of_a_parent_gets_its_sqlstate() {
    for store in stores() {
        misuse(store);
    }
}
