//! Policies are read like a catalog: once a change has committed, every transaction that starts afterwards,
//! in any backend, uses the new numbers, and nothing a transaction read outlives it.
//!
//! - The REPEATABLE READ scenario: a session whose first read of a policy happens inside a transaction whose
//!   snapshot predates an `alter_policy` commit may see the old numbers in that transaction, but never in
//!   the transactions after it (it used to keep them for the life of the backend).
//! - The READ COMMITTED race: one connection raises a policy's burst again and again; another reads it in
//!   a tight loop. A read that starts after a change has committed must never see an older burst.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;

use postgres::Client;
use rate_limit_integration::TestDb;

fn limit(client: &mut Client, policy: &str) -> i64 {
    client
        .query_one("SELECT \"limit\" FROM rate_limit.peek($1, 'k')", &[&policy])
        .expect("peek")
        .get(0)
}

#[test]
fn a_repeatable_read_transaction_does_not_leave_old_numbers_behind() {
    let db = TestDb::new("coherence_rr");
    let mut owner = db.connect();
    owner
        .batch_execute("SELECT rate_limit.create_policy('p', 10, '1 minute', 10)")
        .expect("create");
    let mut reader = db.connect();
    reader
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .expect("snapshot taken before the change");
    owner
        .batch_execute("SELECT rate_limit.alter_policy('p', rate => 50, burst => 50)")
        .expect("alter commits");
    // inside the old snapshot, either number is allowed
    let inside = limit(&mut reader, "p");
    assert!(inside == 10 || inside == 50, "{inside}");
    reader.batch_execute("COMMIT").expect("commit");
    for _ in 0..3 {
        assert_eq!(
            limit(&mut reader, "p"),
            50,
            "a transaction that starts after the change uses the new numbers"
        );
    }
    // and a change after that reaches the same backend too
    owner
        .batch_execute("SELECT rate_limit.alter_policy('p', burst => 7)")
        .expect("alter");
    assert_eq!(limit(&mut reader, "p"), 7);
}

#[test]
fn a_read_committed_reader_never_sees_a_change_older_than_the_last_commit() {
    let db = TestDb::new("coherence_rc");
    db.connect()
        .batch_execute("SELECT rate_limit.create_policy('race', 1, '1 hour', 1)")
        .expect("create");
    let committed = Arc::new(AtomicI64::new(1));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (committed, done) = (committed.clone(), done.clone());
        let mut owner = db.connect();
        thread::spawn(move || {
            for burst in 2..=300i64 {
                owner
                    .execute(
                        "SELECT rate_limit.alter_policy('race', burst => $1)",
                        &[&burst],
                    )
                    .expect("alter");
                committed.store(burst, Ordering::SeqCst); // the commit has returned
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let mut reader = db.connect();
    let mut reads = 0;
    while !done.load(Ordering::SeqCst) {
        let before = committed.load(Ordering::SeqCst);
        let seen = limit(&mut reader, "race");
        assert!(
            seen >= before,
            "read {reads} started after burst {before} had committed and saw {seen}"
        );
        reads += 1;
    }
    writer.join().expect("writer");
    assert_eq!(limit(&mut reader, "race"), 300);
    assert!(
        reads > 50,
        "the reader ran alongside the writer ({reads} reads)"
    );
}
