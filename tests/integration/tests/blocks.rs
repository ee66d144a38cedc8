//! Blocks against a real server. Property checked: from many connections at once, the penalty box counts
//! every denial exactly once in both stores, so exactly `block_after` denials are answered before the key is
//! blocked (the last of them reporting the block) and every later call is denied by the block with its
//! end in `retry_after`; a blocked key's bucket is never touched. Also: a role with only LOGIN cannot block
//! or unblock (42501), and the memory store keeps a count whose caller rolled back while the table store
//! forgets it.

use std::thread;

use postgres::Client;
use rate_limit_integration::TestDb;

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
    the_penalty_box_counts_every_denial_once("memory");
}

/// A denial counted in a transaction that rolls back: the memory store keeps the count (it is not
/// transactional), the table store forgets it.
#[test]
fn a_rolled_back_denial_counts_in_the_memory_store_only() {
    let db = TestDb::new("blocks_rollback");
    let mut c = db.connect();
    for store in ["table", "memory"] {
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
