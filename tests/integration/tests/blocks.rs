//! Blocks against a real server. Property checked: from many connections at once, the penalty box counts
//! every denial exactly once in both stores, so exactly `block_after` denials are answered before the key is
//! blocked (the last of them reporting the block) and every later call is denied by the block with its
//! end in `retry_after`; a blocked key's bucket is never touched. Also: a role with only LOGIN cannot block
//! or unblock (42501), and the memory store keeps a count whose caller rolled back while the table store
//! forgets it.

use std::thread;

use postgres::Client;
use rate_limit_integration::{compiled_only, stores, TestDb};

const THREADS: usize = 8;
const CALLS: usize = 15;

/// `retry_after` of a `take`, in seconds, when denied; `None` when granted.
fn take(c: &mut Client, policy: &str, key: &str) -> Option<f64> {
    let row = c
        .query_one(
            "SELECT allowed, extract(epoch FROM retry_after)::float8 FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .expect("take");
    let allowed: bool = row.get(0);
    if allowed {
        None
    } else {
        Some(
            row.get::<_, Option<f64>>(1)
                .expect("a denial has a retry_after"),
        )
    }
}

/// Policy `guard`: 10 tokens an hour (one every 6 minutes), and a penalty box of 20 denials within the
/// hour, blocking for a day. 8 connections call 15 times each (120 calls) on one key: exactly 10 are
/// granted, 19 denied by the bucket (retry at most 6 minutes), and the other 91 by the block (retry about
/// a day: the 20th denial starts it and reports it). The bucket holds what the 10 grants left.
fn the_penalty_box_counts_every_denial_once(store: &str) {
    let db = TestDb::new(&format!("blocks_{store}"));
    let mut admin = db.connect();
    admin
        .execute(
            "SELECT rate_limit.create_policy('guard', 10, '1 hour', block_after => 20, \
             block_for => '1 day', store => $1)",
            &[&store],
        )
        .expect("create policy");
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut c = db.connect();
            thread::spawn(move || {
                (0..CALLS)
                    .map(|_| take(&mut c, "guard", "k"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let answers: Vec<Option<f64>> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("client"))
        .collect();
    let granted = answers.iter().filter(|a| a.is_none()).count();
    let by_bucket = answers
        .iter()
        .filter(|a| a.is_some_and(|r| r <= 360.0))
        .count();
    let by_block = answers
        .iter()
        .filter(|a| a.is_some_and(|r| r > 86_000.0 && r <= 86_400.0))
        .count();
    assert_eq!(
        (granted, by_bucket, by_block),
        (10, 19, THREADS * CALLS - 29),
        "{store}"
    );
    // the block left the bucket alone: no token was taken after the 10th grant
    let tokens: f64 = admin
        .query_one(
            "SELECT tokens::float8 FROM rate_limit.buckets \
             WHERE policy = 'guard' AND key = 'k' AND algorithm = 'token_bucket'",
            &[],
        )
        .expect("bucket")
        .get(0);
    assert!((0.0..0.1).contains(&tokens), "{store}: {tokens}");
    let blocked: bool = admin
        .query_one("SELECT rate_limit.unblock('guard', 'k')", &[])
        .expect("unblock")
        .get(0);
    assert!(blocked, "{store}");
    assert!(
        take(&mut admin, "guard", "k").is_some_and(|r| r <= 360.0),
        "{store}: unblocked, the bucket answers again"
    );
}

#[test]
fn the_penalty_box_counts_every_denial_once_in_the_table_store() {
    the_penalty_box_counts_every_denial_once("table");
}

#[test]
fn the_penalty_box_counts_every_denial_once_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    the_penalty_box_counts_every_denial_once("memory");
}

/// A denial counted in a transaction that rolls back: the memory store keeps the count (it is not
/// transactional), the table store forgets it.
#[test]
fn a_rolled_back_denial_counts_in_the_memory_store_only() {
    let db = TestDb::new("blocks_rollback");
    let mut c = db.connect();
    for store in stores() {
        let policy = format!("once_{store}");
        c.execute(
            "SELECT rate_limit.create_policy($1, 1, '1 hour', block_after => 2, \
             block_for => '1 day', store => $2)",
            &[&policy, &store],
        )
        .expect("create policy");
        assert_eq!(take(&mut c, &policy, "k"), None);
        let mut tx = c.transaction().expect("begin");
        let denied: bool = !tx
            .query_one("SELECT allowed FROM rate_limit.take($1, 'k')", &[&policy])
            .expect("take")
            .get::<_, bool>(0);
        assert!(denied);
        tx.rollback().expect("rollback");
        let retry = take(&mut c, &policy, "k").expect("denied");
        if store == "memory" {
            assert!(retry > 86_000.0, "the second denial blocks: {retry}");
        } else {
            assert!(retry <= 3600.0, "the first denial was forgotten: {retry}");
        }
    }
}

/// A role with only LOGIN may be denied and blocked by the penalty box, but may neither block nor unblock
/// a key by hand: 42501.
#[test]
fn only_the_owner_blocks_by_hand() {
    let db = TestDb::new("blocks_roles");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('api', 5, '1 minute'); \
             DROP ROLE IF EXISTS blocks_visitor; CREATE ROLE blocks_visitor LOGIN",
        )
        .expect("setup");
    let mut visitor = db.connect();
    visitor
        .batch_execute("SET ROLE blocks_visitor")
        .expect("become the visitor");
    for call in [
        "SELECT rate_limit.block('api', 'alice', '1 hour')",
        "SELECT rate_limit.unblock('api', 'alice')",
    ] {
        let e = visitor.batch_execute(call).expect_err("refused");
        assert_eq!(
            e.code(),
            Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{call}"
        );
    }
    assert_eq!(take(&mut visitor, "api", "alice"), None);
}

/// No deadlock between two callers of one key under a penalty box, in every interleaving of two
/// transactions (the lock order of the seam: a policy's bucket before its block bucket). The key starts
/// with 1 of its 2 tokens; A takes twice, B asks for 2 then 1: B's denials are counted while A holds the
/// bucket. Before, one interleaving (A: take, B: take 2, A: take, B: take) ended in 40P01 in the table
/// store; now every one ends with no error in both stores, and the penalty box counted every denial.
#[test]
fn two_callers_of_one_key_never_deadlock_under_a_penalty_box() {
    let db = TestDb::new("blocks_deadlock");
    let mut admin = db.connect();
    for store in stores() {
        let policy = format!("dl_{store}");
        admin
            .execute(
                "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => 2, block_after => 50, \
                 block_for => '1 hour', store => $2)",
                &[&policy, &store],
            )
            .expect("create policy");
        let a = [
            format!("BEGIN; SELECT rate_limit.take('{policy}', '{{key}}')"),
            format!("SELECT rate_limit.take('{policy}', '{{key}}')"),
            "COMMIT".to_string(),
        ];
        let b = [
            format!("BEGIN; SELECT rate_limit.take('{policy}', '{{key}}', 2)"),
            format!("SELECT rate_limit.take('{policy}', '{{key}}')"),
            "COMMIT".to_string(),
        ];
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let b: Vec<&str> = b.iter().map(String::as_str).collect();
        let runs = rate_limit_integration::interleavings(
            || db.connect(),
            [&a, &b],
            |c, key| {
                assert_eq!(take(c, &policy, key), None, "the first of 2 tokens");
            },
        );
        rate_limit_integration::assert_every_interleaving_answers(&runs, 20, store);
        // 4 calls on 1 token in each interleaving: 1 grant, 3 denials, all counted (the count's bucket
        // lists 50 - 3 = 47 denials still tolerated)
        let counted: Vec<i64> = admin
            .query(
                "SELECT floor(tokens)::int8 FROM rate_limit.buckets \
                 WHERE policy = $1 AND algorithm = 'block'",
                &[&policy],
            )
            .expect("counts")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(counted, vec![47; 20], "{store}");
    }
}

/// A penalty box under shadow mode shows whom it would block (a would-be denial whose `reset_after` is the
/// block's end), but that block is never
/// enforced once shadow mode ends: after `alter_policy(shadow => false)` the key is denied by its bucket
/// (retry within the hour of its refill), and counted afresh (before: denied by the shadowed block, with a
/// day to wait, and nothing said so). In both stores.
#[test]
fn a_block_made_under_shadow_mode_is_not_enforced_after_it() {
    let db = TestDb::new("blocks_shadow");
    let mut c = db.connect();
    for store in stores() {
        let policy = format!("sh_{store}");
        c.execute(
            "SELECT rate_limit.create_policy($1, 1, '1 hour', block_after => 2, \
             block_for => '1 day', shadow => true, store => $2)",
            &[&policy, &store],
        )
        .expect("create policy");
        let would_be: Vec<bool> = (0..4)
            .map(|_| {
                let row = c
                    .query_one(
                        "SELECT allowed, shadow_denied, \
                         extract(epoch FROM reset_after)::float8 > 86000 \
                         FROM rate_limit.take($1, 'k')",
                        &[&policy],
                    )
                    .expect("take");
                assert!(row.get::<_, bool>(0), "{store}: shadow mode allows");
                row.get::<_, bool>(1) && row.get::<_, bool>(2)
            })
            .collect();
        assert_eq!(
            would_be,
            [false, false, true, true],
            "{store}: the second would-be denial would block for a day"
        );
        c.execute(
            "SELECT rate_limit.alter_policy($1, shadow => false)",
            &[&policy],
        )
        .expect("shadow off");
        for n in 1..=2 {
            let retry = take(&mut c, &policy, "k").expect("the bucket is empty");
            if n == 1 {
                assert!(
                    retry <= 3600.0,
                    "{store}: denied by the bucket, not a shadowed block: {retry}"
                );
            } else {
                assert!(
                    retry > 86_000.0,
                    "{store}: the second real denial blocks: {retry}"
                );
            }
        }
    }
}

/// No deadlock between two `take_many` callers of one key under two policies with penalty boxes, asking in
/// opposite orders, in every interleaving of their transactions: a call locks the buckets it takes and
/// counts its denials in (namespace, key) order, each bucket before its block bucket. The key has 1 token
/// under `pa` and none under `pb`, so every call is denied by `pb` (and counted) while `pa` may grant.
#[test]
fn take_many_in_opposite_orders_never_deadlocks_under_penalty_boxes() {
    let db = TestDb::new("blocks_deadlock_many");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('pa', 1, '1 hour', burst => 2, block_after => 50, block_for => '1 hour', store => 'table');
             SELECT rate_limit.create_policy('pb', 1, '1 hour', burst => 1, block_after => 50, block_for => '1 hour', store => 'table');",
        )
        .expect("policies");
    let a = [
        "BEGIN; SELECT rate_limit.take_many(ARRAY['pa', 'pb'], ARRAY['{key}'])",
        "SELECT rate_limit.take('pa', '{key}')",
        "SELECT rate_limit.take_many(ARRAY['pa', 'pb'], ARRAY['{key}'])",
        "COMMIT",
    ];
    let b = [
        "BEGIN; SELECT rate_limit.take_many(ARRAY['pb', 'pa'], ARRAY['{key}'])",
        "SELECT rate_limit.take('pb', '{key}')",
        "SELECT rate_limit.take_many(ARRAY['pb', 'pa'], ARRAY['{key}'])",
        "COMMIT",
    ];
    let runs = rate_limit_integration::interleavings(
        || db.connect(),
        [&a, &b],
        |c, key| {
            c.execute("SELECT rate_limit.take('pb', $1)", &[&key])
                .expect("empty pb");
        },
    );
    rate_limit_integration::assert_every_interleaving_answers(&runs, 70, "take_many");
}
