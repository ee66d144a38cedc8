//! `rate_limit.limit_writes` from many writers at once: a BEFORE INSERT trigger limiting rows per author
//! lets exactly the policy's burst of rows in, in both stores, and every refused insert fails with 53400
//! and the RateLimit header values in DETAIL. A write rolled back after its trigger ran gives its token
//! back in the table store (it is part of the transaction), and keeps it spent in the memory store.

use std::thread;

use postgres::error::SqlState;
use rate_limit_integration::{compiled_only, TestDb};

const WRITERS: usize = 16;
const INSERTS: usize = 40;
const BURST: i64 = 100;

/// Sixteen connections insert 40 comments each by author 7 (640 attempts) under a policy of 100 per 400
/// days: exactly 100 rows exist afterwards, each writer's successes and 53400 failures add up to its
/// attempts, and no other error occurs.
fn concurrent_writers_get_exactly_the_burst(store: &str) {
    let db = TestDb::new(&format!("write_limits_{store}"));
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "SELECT rate_limit.create_policy('comments_per_author', {BURST}, '400 days', store => '{store}');
             CREATE TABLE comments (id bigserial PRIMARY KEY, author_id int NOT NULL, body text);
             CREATE TRIGGER comments_rate_limit BEFORE INSERT ON comments FOR EACH ROW
                 EXECUTE FUNCTION rate_limit.limit_writes('comments_per_author', 'author_id');
             DO $$ BEGIN CREATE ROLE rl_it_writer; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT INSERT, SELECT ON comments TO rl_it_writer;
             GRANT USAGE ON SEQUENCE comments_id_seq TO rl_it_writer;"
        ))
        .expect("set up the table, the policy and the trigger");
    let handles: Vec<_> = (0..WRITERS)
        .map(|_| {
            let mut client = db.connect();
            thread::spawn(move || {
                // an ordinary role: no rights on the extension's tables, only on its own table
                client
                    .batch_execute("SET ROLE rl_it_writer")
                    .expect("set role");
                let (mut inserted, mut denied) = (0usize, 0usize);
                for i in 0..INSERTS {
                    match client.execute(
                        "INSERT INTO comments (author_id, body) VALUES (7, $1)",
                        &[&format!("comment {i}")],
                    ) {
                        Ok(_) => inserted += 1,
                        Err(e) => {
                            let db_error = e.as_db_error().expect("a server error");
                            assert_eq!(
                                db_error.code(),
                                &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
                                "{db_error:?}"
                            );
                            let detail = db_error.detail().unwrap_or_default();
                            assert!(
                                detail.contains("RateLimit: \"comments_per_author\";r=0;")
                                    && detail.contains(
                                        "RateLimit-Policy: \"comments_per_author\";q=100;"
                                    )
                                    && detail.contains("Retry-After: "),
                                "DETAIL carries the header values: {detail}"
                            );
                            denied += 1;
                        }
                    }
                }
                (inserted, denied)
            })
        })
        .collect();
    let (mut inserted, mut denied) = (0, 0);
    for h in handles {
        let (i, d) = h.join().expect("writer thread");
        assert_eq!(i + d, INSERTS);
        inserted += i;
        denied += d;
    }
    let rows: i64 = admin
        .query_one("SELECT count(*) FROM comments", &[])
        .expect("count")
        .get(0);
    assert_eq!(
        inserted as i64, BURST,
        "{store} store: inserts that succeeded"
    );
    assert_eq!(rows, BURST, "{store} store: rows in the table");
    assert_eq!(denied, WRITERS * INSERTS - BURST as usize);
    // another author is not affected
    admin
        .execute("INSERT INTO comments (author_id) VALUES (8)", &[])
        .expect("another author's first comment");
}

#[test]
fn concurrent_writers_get_exactly_the_burst_table_store() {
    concurrent_writers_get_exactly_the_burst("table");
}

#[test]
fn concurrent_writers_get_exactly_the_burst_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    concurrent_writers_get_exactly_the_burst("memory");
}

/// In the table store the trigger's tokens are part of the writing transaction; in the memory store they
/// are not (documented): a rolled-back insert gives its token back only in the table store.
#[test]
fn a_rolled_back_write_gives_its_token_back_in_the_table_store_only() {
    let db = TestDb::new("write_limits_rollback");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT rate_limit.create_policy('t_writes', 1, '400 days', store => 'table');
         SELECT rate_limit.create_policy('m_writes', 1, '400 days', store => 'memory');
         CREATE TABLE t (k text NOT NULL);
         CREATE TABLE m (k text NOT NULL);
         CREATE TRIGGER t_limit BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('t_writes', 'k');
         CREATE TRIGGER m_limit BEFORE INSERT ON m FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('m_writes', 'k');",
    )
    .expect("set up");
    c.batch_execute("BEGIN; INSERT INTO t VALUES ('a'); ROLLBACK;")
        .expect("insert and roll back");
    c.execute("INSERT INTO t VALUES ('a')", &[])
        .expect("the table store gave the rolled-back token back");
    if compiled_only("the memory store") {
        return;
    }
    c.batch_execute("BEGIN; INSERT INTO m VALUES ('a'); ROLLBACK;")
        .expect("insert and roll back");
    let e = c
        .execute("INSERT INTO m VALUES ('a')", &[])
        .expect_err("the memory store keeps the token spent");
    assert_eq!(e.code(), Some(&SqlState::CONFIGURATION_LIMIT_EXCEEDED));
}
