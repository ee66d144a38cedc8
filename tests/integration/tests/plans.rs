//! The table store's statements reach a bucket's row through the primary key whatever the table's size
//! was when a backend planned them. A session keeps its statements' plans for its whole life (the compiled
//! edition's kept SPI plans, the portable edition's PL/pgSQL plans), and PostgreSQL costs a plan with the
//! table's size at that moment: planned while the table was empty (a new installation, or after the purge
//! deleted every bucket and VACUUM truncated the table), a lookup by key was a sequential scan, and every
//! call of that session then read the whole table as it grew back, until something invalidated the plan
//! (found by bench/suites/reservations.sh: whole rounds twenty times slower).

use postgres::GenericClient;
use rate_limit_integration::TestDb;

/// The sequential scans of `table` counted so far in this session's statistics not yet sent, and the rows
/// they read. The `pg_stat_xact_*` counters are a backend's pending statistics, which PostgreSQL sends
/// when the session goes idle at most once a second (half a second before 15): they may still hold
/// earlier transactions' counts, so a measure is the difference of two readings inside one transaction
/// (nothing is sent while a transaction is open).
fn seq_scans(client: &mut impl GenericClient, table: &str) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT seq_scan, seq_tup_read FROM pg_catalog.pg_stat_xact_user_tables
              WHERE relid OPERATOR(pg_catalog.=) $1::pg_catalog.text::pg_catalog.regclass",
            &[&table],
        )
        .expect("read this transaction's table statistics");
    (row.get(0), row.get(1))
}

/// The sequential scans of `table` that `calls` made, and the rows they read, measured in one transaction
/// of `session` (committed).
fn seq_scans_by(session: &mut postgres::Client, table: &str, calls: &str) -> (i64, i64) {
    let mut check = session.transaction().expect("begin");
    let before = seq_scans(&mut check, table);
    check.batch_execute(calls).expect("the calls measured");
    let after = seq_scans(&mut check, table);
    check.commit().expect("commit");
    (after.0 - before.0, after.1 - before.1)
}

/// One session makes its plans while the state table is empty and vacuumed (0 pages: the planner knows it
/// is empty); 20 000 buckets are then made by another session. The first session's calls, on a bucket
/// that exists and on one that does not, through `take` and `rate_limiting_request`, read no row by a
/// sequential scan of the state table.
#[test]
fn plans_made_on_an_empty_table_still_reach_one_row_by_its_key() {
    let db = TestDb::new("plans_empty_table");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('plans', 1000, '1 second', store => 'table');
             -- no autovacuum: its statistics would invalidate the session's plans and hide the defect
             ALTER TABLE rate_limit.bucket_state SET (autovacuum_enabled = off)",
        )
        .expect("set up the policy");
    admin
        .batch_execute("VACUUM rate_limit.bucket_state")
        .expect("vacuum the empty state table");
    let pages: i64 = admin
        .query_one(
            "SELECT pg_catalog.pg_relation_size('rate_limit.bucket_state') / 8192",
            &[],
        )
        .expect("read the table's size")
        .get(0);
    assert_eq!(pages, 0, "the state table should start empty");

    // the session's plans: more than five calls of each statement, so that PostgreSQL settles on a
    // generic plan, all made while the table holds at most a few dozen rows
    let mut session = db.connect();
    session
        .batch_execute("SET rate_limit.store = 'table'")
        .expect("choose the table store");
    for i in 0..12 {
        session
            .batch_execute(&format!(
                "SELECT rate_limit.take('plans', 'early-{i}');
                 SELECT rate_limit.take('plans', 'early-{i}');
                 SELECT rate_limiting_request('early-{i}', 1000, 60);
                 SELECT rate_limiting_request('early-{i}', 1000, 60)"
            ))
            .expect("call while the table is empty");
    }

    admin
        .batch_execute(
            "SET rate_limit.store = 'table';
             SELECT count(*) FROM pg_catalog.generate_series(1, 10000) g,
                    LATERAL rate_limit.take('plans', 'later-' || g) t;
             SELECT count(rate_limiting_request('later-' || g, 1000, 60))
               FROM pg_catalog.generate_series(1, 10000) g",
        )
        .expect("make 20 000 buckets from another session");

    let measured = seq_scans_by(
        &mut session,
        "rate_limit.bucket_state",
        "SELECT rate_limit.take('plans', 'early-1');
         SELECT rate_limit.take('plans', 'new-key');
         SELECT rate_limiting_request('early-1', 1000, 60);
         SELECT rate_limiting_request('new-key', 1000, 60)",
    );
    assert_eq!(
        measured,
        (0, 0),
        "the calls scanned the whole state table (sequential scans, rows read)"
    );
}

/// One session makes its plans while no key has an override (the table vacuumed empty); the owner then
/// sets 20 000 overrides (of
/// other keys). The session's next calls read no override by a sequential scan of
/// `rate_limit.key_overrides` (the portable edition's fast `take` reads a key's override in a subquery).
#[test]
fn plans_made_without_overrides_still_reach_one_override_by_its_key() {
    let db = TestDb::new("plans_no_overrides");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('plans', 1000, '1 second', store => 'table');
             ALTER TABLE rate_limit.key_overrides SET (autovacuum_enabled = off)",
        )
        .expect("set up the policy");
    // vacuumed while empty (as after overrides set and cleared): the planner knows it is empty
    admin
        .batch_execute("VACUUM rate_limit.key_overrides")
        .expect("vacuum the empty overrides table");
    let mut session = db.connect();
    session
        .batch_execute("SET rate_limit.store = 'table'")
        .expect("choose the table store");
    for i in 0..12 {
        session
            .batch_execute(&format!("SELECT rate_limit.take('plans', 'early-{i}')"))
            .expect("call while no key has an override");
    }
    admin
        .batch_execute(
            "SELECT count(rate_limit.set_override('plans', 'other-' || g, rate => 5))
               FROM pg_catalog.generate_series(1, 20000) g",
        )
        .expect("set 20 000 overrides");
    // a first call, outside the measure: what is read once after a change is not what this test is
    // about (in the compiled edition, the first call of a database to meet an override builds the shared
    // filter of overridden keys with one full read of the table, src/policies/overrides/filter.rs); a kept
    // plan that scans does so in every call
    session
        .batch_execute("SELECT rate_limit.take('plans', 'warm-up')")
        .expect("a call before the ones measured");
    let measured = seq_scans_by(
        &mut session,
        "rate_limit.key_overrides",
        "SELECT rate_limit.take('plans', 'early-1');
         SELECT rate_limit.take('plans', 'new-key')",
    );
    assert_eq!(
        measured,
        (0, 0),
        "the calls scanned every override (sequential scans, rows read)"
    );
}
