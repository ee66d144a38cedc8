//! A key's block is read only where one can exist (a policy with a penalty box, or once a key was blocked
//! by hand), with no change in what callers see: a block by hand applies to the next call of every
//! session, inside a transaction that began before it and cached the policy too, in both stores; the
//! memory store keeps a block whose caller rolled back, and reads it.

use postgres::GenericClient;
use rate_limit_integration::{compiled_only, TestDb};

/// Whether a `take` of `key` under `policy` is allowed.
fn allowed(c: &mut impl GenericClient, policy: &str, key: &str) -> bool {
    c.query_one(
        "SELECT allowed FROM rate_limit.take($1, $2)",
        &[&policy, &key],
    )
    .expect("take")
    .get(0)
}

/// Session B is in a transaction that has used the policy (its row cached, saying nobody was ever blocked)
/// when session A blocks a key by hand and commits: B's next call, in the same transaction, is denied.
fn a_first_block_applies_inside_a_running_transaction(store: &str) {
    let db = TestDb::new(&format!("block_reads_{store}"));
    let mut a = db.connect();
    a.execute(
        "SELECT rate_limit.create_policy('plain', 1000, '1 minute', store => $1)",
        &[&store],
    )
    .expect("policy");
    let mut b = db.connect();
    let mut tx = b.transaction().expect("begin");
    assert!(allowed(&mut tx, "plain", "k"));
    assert!(allowed(&mut tx, "plain", "k"));
    a.execute("SELECT rate_limit.block('plain', 'k', '1 hour')", &[])
        .expect("block");
    assert!(!allowed(&mut tx, "plain", "k"), "{store}: B's next call");
    assert!(allowed(&mut tx, "plain", "other"), "{store}: other keys");
    tx.commit().expect("commit");
    assert!(!allowed(&mut b, "plain", "k"));
}

#[test]
fn a_first_block_applies_inside_a_running_transaction_in_the_table_store() {
    a_first_block_applies_inside_a_running_transaction("table");
}

#[test]
fn a_first_block_applies_inside_a_running_transaction_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    a_first_block_applies_inside_a_running_transaction("memory");
}

/// The memory store keeps a block whose caller rolled back (it acts at once); the policy's row, which the
/// ROLLBACK restored, does not say so, and the block is read and enforced all the same.
#[test]
fn a_rolled_back_block_in_the_memory_store_is_still_enforced() {
    if compiled_only("the memory store") {
        return;
    }
    let db = TestDb::new("block_reads_rollback");
    let mut a = db.connect();
    a.execute(
        "SELECT rate_limit.create_policy('mem', 1000, '1 minute', store => 'memory')",
        &[],
    )
    .expect("policy");
    let mut b = db.connect();
    assert!(allowed(&mut b, "mem", "k"));
    let mut tx = a.transaction().expect("begin");
    tx.execute("SELECT rate_limit.block('mem', 'k', '1 hour')", &[])
        .expect("block");
    tx.rollback().expect("rollback");
    let noted: bool = a
        .query_one(
            "SELECT blocks_by_hand FROM rate_limit.policies WHERE name = 'mem'",
            &[],
        )
        .expect("row")
        .get(0);
    assert!(!noted);
    assert!(!allowed(&mut b, "mem", "k"));
    assert!(allowed(&mut b, "mem", "other"));
}
