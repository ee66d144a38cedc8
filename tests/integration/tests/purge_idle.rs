//! `CALL rate_limit.purge_idle()`, the purge to schedule with pg_cron where no background worker runs (the
//! portable edition, or the library not preloaded), in both editions: it deletes only full buckets left
//! untouched for its interval, 1 000 rows of the state table per transaction, so that a key in use keeps
//! its row and no transaction of the purge holds more than one span's rows; and it refuses misuse with the
//! SQLSTATE of each.

use std::thread;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::Client;
use rate_limit_integration::purge::{assert_idle_deleted_span_by_span, KeyInUse, RECORD_DELETIONS};
use rate_limit_integration::{edition, Edition, TestDb};

fn count(client: &mut Client, query: &str) -> i64 {
    client
        .query_one(query, &[])
        .unwrap_or_else(|e| panic!("{query}: {e}"))
        .get(0)
}

/// The SQLSTATE `statement` fails with.
fn fails_with(client: &mut Client, statement: &str) -> SqlState {
    let e = client
        .batch_execute(statement)
        .expect_err(&format!("{statement} should fail"));
    e.code()
        .unwrap_or_else(|| panic!("{statement}: not a server error: {e}"))
        .clone()
}

/// 3 000 buckets that refilled long ago, 10 that are not full, and one key called every 20 ms throughout
/// (full again within a millisecond of each call): three `CALL rate_limit.purge_idle('1 second')` a second
/// apart delete exactly the 3 000, in transactions of at most 1 000 rows each, never the key in use nor a
/// bucket that is not full.
#[test]
fn purge_idle_deletes_idle_full_buckets_one_span_a_transaction_and_keeps_a_key_in_use() {
    let db = TestDb::new("purge_idle_spans");
    let mut admin = db.connect();
    admin
        .batch_execute(RECORD_DELETIONS)
        .expect("the record of deletions");
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('refills', 1000, '1 second', burst => 1, store => 'table');
             SELECT rate_limit.create_policy('slow', 1, '1 day', burst => 10, store => 'table');
             SELECT count(*) FROM generate_series(1, 3000) AS g, LATERAL rate_limit.take('refills', 'idle' || g);
             SELECT count(*) FROM generate_series(1, 10) AS g, LATERAL rate_limit.take('slow', 'drained' || g);",
        )
        .expect("the buckets");
    thread::sleep(Duration::from_millis(1100));

    let hot = KeyInUse::start(db.connect(), "refills", "hot");
    thread::sleep(Duration::from_millis(200));
    for round in 0..3 {
        admin
            .batch_execute("CALL rate_limit.purge_idle('1 second')")
            .expect("purge_idle");
        if round == 0 && edition() == Edition::Portable {
            // no worker records purges here: rate_limit.metrics_purge shows the last CALL's
            assert_eq!(
                count(
                    &mut admin,
                    "SELECT freed FROM rate_limit.metrics_purge WHERE store = 'table'"
                ),
                3000,
                "the first CALL deleted every idle bucket"
            );
        }
        thread::sleep(Duration::from_millis(1100));
    }
    let calls = hot.stop();
    assert!(
        calls > 50,
        "the hot key was called throughout: {calls} calls"
    );

    assert_idle_deleted_span_by_span(&mut admin, 3000);
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM public.purged WHERE key NOT LIKE 'idle%'"
        ),
        0,
        "a bucket that is not full, or in use, was deleted"
    );
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM public.purged"),
        3000,
        "each idle bucket deleted once"
    );
}

/// NULL, a negative interval and months are refused with 22004 and 22023; inside a transaction block the
/// procedure cannot commit (2D000); a role with only LOGIN may run neither the procedure nor its span
/// function (42501).
#[test]
fn purge_idle_refuses_misuse() {
    let db = TestDb::new("purge_idle_misuse");
    let mut admin = db.connect();
    for (statement, code) in [
        (
            "CALL rate_limit.purge_idle(NULL)",
            SqlState::NULL_VALUE_NOT_ALLOWED,
        ),
        (
            "CALL rate_limit.purge_idle('-1 second')",
            SqlState::INVALID_PARAMETER_VALUE,
        ),
        (
            "CALL rate_limit.purge_idle('1 month')",
            SqlState::INVALID_PARAMETER_VALUE,
        ),
        (
            "BEGIN; CALL rate_limit.purge_idle(); COMMIT",
            SqlState::INVALID_TRANSACTION_TERMINATION,
        ),
    ] {
        assert_eq!(fails_with(&mut admin, statement), code, "{statement}");
        admin.batch_execute("ROLLBACK").ok();
    }
    admin
        .batch_execute("CALL rate_limit.purge_idle()")
        .expect("the owner's CALL on its own");

    let span = match edition() {
        Edition::Compiled => "rate_limit.purge_span",
        Edition::Portable => "rate_limit._purge_span",
    };
    let mut role = db.connect_as_login_role("rl_it_purge_idle_role");
    for statement in [
        "CALL rate_limit.purge_idle()".to_string(),
        format!("SELECT * FROM {span}('1 second', NULL, NULL)"),
    ] {
        assert_eq!(
            fails_with(&mut role, &statement),
            SqlState::INSUFFICIENT_PRIVILEGE,
            "{statement}"
        );
    }
}
