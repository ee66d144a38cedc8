//! Semantics against a real server, one client connection at a time:
//! - a client polling faster than the refill still receives exactly the refill rate (the PL/pgSQL baseline
//!   written from the reference contract receives nothing on the same schedule);
//! - denied calls write nothing: no WAL, no transaction id;
//! - consumption is transactional: ROLLBACK refunds;
//! - read-only transactions: denials work, a grant raises 25006.

use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use rate_limit_integration::{settle, sleep_until, TestDb};

fn request(client: &mut Client, id: &str, rate: i32, window: i32) -> i32 {
    client
        .query_one(
            "SELECT rate_limiting_request($1, $2, $3)",
            &[&id, &rate, &window],
        )
        .expect("rate_limiting_request")
        .get(0)
}

fn baseline(client: &mut Client, id: &str, rate: i32, window: i32) -> i32 {
    client
        .query_one(
            "SELECT baseline_rate_limiting_request($1, $2, $3)",
            &[&id, &rate, &window],
        )
        .expect("baseline_rate_limiting_request")
        .get(0)
}

/// One polling run: a full bucket of 10 refilling 2 tokens/s is drained by 10 quick calls, then called
/// every 100 ms, 60 times.
struct Polled {
    /// How many of the 60 polls were granted.
    granted: usize,
    /// Measured bounds of the time from the first draining call to the last poll (the true span lies
    /// between them: `shortest` ends before the last poll started and starts after the first call ended).
    shortest: Duration,
    longest: Duration,
}

/// Polls once with key `id`; `None` when the run cannot be judged: the drain, or the time between two
/// polls, may have reached 250 ms (measured from before the one to after the other), so the machine, not
/// the limiter, decided what was granted.
fn poll(
    client: &mut Client,
    call: fn(&mut Client, &str, i32, i32) -> i32,
    id: &str,
) -> Option<Polled> {
    let before_first = Instant::now();
    let mut after_first = None;
    for _ in 0..10 {
        assert!(
            call(client, id, 2, 5) >= 0,
            "the first 10 calls drain a full bucket"
        );
        after_first.get_or_insert_with(Instant::now);
    }
    let after_first = after_first.expect("ten calls made");
    let start = Instant::now();
    let mut widest_gap = start - before_first;
    let mut before_previous = before_first;
    let mut granted = 0;
    let mut before_last = start;
    for i in 1..=60u32 {
        sleep_until(start + Duration::from_millis(100) * i);
        before_last = Instant::now();
        granted += usize::from(call(client, id, 2, 5) >= 0);
        widest_gap = widest_gap.max(Instant::now() - before_previous);
        before_previous = before_last;
    }
    (widest_gap < Duration::from_millis(250)).then_some(Polled {
        granted,
        shortest: before_last - after_first,
        longest: Instant::now() - before_first,
    })
}

/// Polls until a run can be judged (at most 3 runs, each with a key of its own).
fn judged_poll(
    client: &mut Client,
    call: fn(&mut Client, &str, i32, i32) -> i32,
    name: &str,
) -> Polled {
    (0..3)
        .find_map(|run| poll(client, call, &format!("{name}_{run}")))
        .expect("one of 3 polling runs without a pause of 250 ms")
}

/// A client that polls a drained bucket gets exactly what refills: never more than 2 tokens/s over the
/// measured span (conservation), and less by under one token (the bucket holds under one token after
/// each poll while polls come less than 0.5 s apart). The PL/pgSQL baseline, which rounds the refill of
/// each 100 ms to whole tokens, grants none.
#[test]
fn polling_client_receives_the_refill_rate() {
    let db = TestDb::new("polling");
    let mut client = db.connect();
    let p = judged_poll(&mut client, request, "poller");
    let (most, least) = (
        2.0 * p.longest.as_secs_f64(),
        2.0 * p.shortest.as_secs_f64() - 1.0,
    );
    assert!(
        (p.granted as f64) <= most && (p.granted as f64) > least,
        "granted {} of 60 polls; the measured span allows more than {least:.2} and at most {most:.2}",
        p.granted
    );

    let baseline_sql = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/setup/baseline.sql"
    ))
    .expect("bench/setup/baseline.sql");
    client
        .batch_execute(&baseline_sql)
        .expect("install the baseline");
    let p = judged_poll(&mut client, baseline, "baseline_poller");
    assert_eq!(
        p.granted, 0,
        "the rounding PL/pgSQL baseline starves a polling client"
    );
}

#[test]
fn denied_calls_write_no_wal_and_take_no_transaction_id() {
    let db = TestDb::new("no_wal");
    let mut client = db.connect();
    client
        .batch_execute("ALTER TABLE rate_limit.bucket_state SET (autovacuum_enabled = off)")
        .expect("quiet table");
    // Each round drains 1000 one-token buckets (one granted call each, so none is remembered as short by
    // this backend), reads them once (hint bits are a one-time write any reader does), then denies each of
    // them once through SQL inside one transaction. Background processes (checkpointer, standby snapshots)
    // may write WAL during a round: such a round is repeated, but every round must show no transaction id.
    let mut clean_round = false;
    for round in 0..5 {
        let prefix = format!("wal_{round}_");
        let drained: i64 = client
            .query_one(
                "SELECT count(*) FILTER (WHERE rate_limiting_request($1 || g, 1, 1) = 0) \
                 FROM generate_series(1, 1000) AS g",
                &[&prefix],
            )
            .expect("drain")
            .get(0);
        assert_eq!(drained, 1000);
        client
            .query_one("SELECT count(*) FROM rate_limit.bucket_state", &[])
            .expect("set hint bits");
        let mut tx = client.transaction().expect("begin");
        let before = tx
            .query_one(
                "SELECT pg_current_wal_lsn()::text, pg_current_wal_insert_lsn()::text",
                &[],
            )
            .expect("lsn");
        let denied: i64 = tx
            .query_one(
                "SELECT count(*) FILTER (WHERE rate_limiting_request($1 || g, 1, 1) = -1) \
                 FROM generate_series(1, 1000) AS g",
                &[&prefix],
            )
            .expect("1000 calls")
            .get(0);
        let no_xid: bool = tx
            .query_one("SELECT pg_current_xact_id_if_assigned() IS NULL", &[])
            .expect("xid")
            .get(0);
        let after = tx
            .query_one(
                "SELECT pg_current_wal_lsn()::text, pg_current_wal_insert_lsn()::text",
                &[],
            )
            .expect("lsn");
        tx.commit().expect("commit");
        if denied != 1000 {
            continue; // a second passed and a token came back: it was granted and written; run again
        }
        assert!(
            no_xid,
            "1000 denied calls assigned a transaction id: something was written"
        );
        let (b0, b1): (String, String) = (before.get(0), before.get(1));
        let (a0, a1): (String, String) = (after.get(0), after.get(1));
        if b0 == a0 && b1 == a1 {
            clean_round = true;
            break;
        }
        eprintln!("WAL moved during a round ({b1} -> {a1}); repeating");
        settle();
    }
    assert!(clean_round, "WAL moved in every round of 1000 denied calls");
}

#[test]
fn rollback_refunds_and_commit_keeps() {
    let db = TestDb::new("rollback");
    let mut client = db.connect();
    assert_eq!(request(&mut client, "rb", 1, 10), 9);
    let mut tx = client.transaction().expect("begin");
    for expected in [8, 7] {
        let got: i32 = tx
            .query_one("SELECT rate_limiting_request('rb', 1, 10)", &[])
            .expect("request")
            .get(0);
        assert_eq!(got, expected);
    }
    tx.rollback().expect("rollback");
    assert_eq!(
        request(&mut client, "rb", 1, 10),
        8,
        "the rolled-back tokens were refunded"
    );
    let mut tx = client.transaction().expect("begin");
    tx.query_one("SELECT rate_limiting_request('rb', 1, 10)", &[])
        .expect("request");
    tx.commit().expect("commit");
    assert_eq!(
        request(&mut client, "rb", 1, 10),
        6,
        "the committed token stays taken"
    );
}

#[test]
fn read_only_transactions_deny_without_writing_and_refuse_grants_with_25006() {
    let db = TestDb::new("read_only");
    let mut client = db.connect();
    assert_eq!(request(&mut client, "ro", 1, 1), 0);
    client
        .batch_execute("SET default_transaction_read_only = on")
        .expect("read-only session");
    assert_eq!(
        request(&mut client, "ro", 1, 1),
        -1,
        "a denial needs no write"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let err = client
        .query_one("SELECT rate_limiting_request('ro', 1, 1)", &[])
        .expect_err("a grant cannot be recorded in a read-only transaction");
    assert_eq!(err.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION));
    let message = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert_eq!(message, "cannot take a token in a read-only transaction");
}

/// Each call that cannot write in a read-only transaction (table store) says what it could not do in
/// its 25006 message (before: "cannot take a token" for block, unblock, release and charge too).
#[test]
fn read_only_refusals_name_what_they_could_not_do() {
    let db = TestDb::new("read_only_messages");
    let mut client = db.connect();
    client
        .batch_execute(
            "SELECT rate_limit.create_policy('ro_api', 5, '1 minute', max_debt => 5, store => 'table');
             SELECT rate_limit.create_policy('ro_jobs', 2, '1 minute', algorithm => 'concurrency', store => 'table');",
        )
        .expect("policies");
    let lease: i64 = client
        .query_one("SELECT lease FROM rate_limit.acquire('ro_jobs', 'k')", &[])
        .expect("acquire")
        .get(0);
    let cases = [
        (
            "SELECT rate_limit.take('ro_api', 'k')".to_string(),
            "cannot take a token",
        ),
        (
            "SELECT rate_limit.charge('ro_api', 'k', 1)".to_string(),
            "cannot charge a bucket",
        ),
        (
            "SELECT rate_limit.block('ro_api', 'k', '1 minute')".to_string(),
            "cannot block a key",
        ),
        (
            "SELECT rate_limit.unblock('ro_api', 'k')".to_string(),
            "cannot unblock a key",
        ),
        (
            "SELECT rate_limit.acquire('ro_jobs', 'k')".to_string(),
            "cannot acquire a lease",
        ),
        (
            format!("SELECT rate_limit.release('ro_jobs', 'k', {lease})"),
            "cannot release a lease",
        ),
        (
            "SELECT rate_limit.refund('ro_api', 'k', 1)".to_string(),
            "cannot refund tokens",
        ),
        (
            "SELECT rate_limit.reset('ro_api', 'k')".to_string(),
            "cannot reset a bucket",
        ),
    ];
    for (sql, action) in cases {
        let e = client
            .batch_execute(&format!("BEGIN READ ONLY; {sql}"))
            .expect_err(&sql);
        client.batch_execute("ROLLBACK").expect("rollback");
        assert_eq!(
            e.code(),
            Some(&SqlState::READ_ONLY_SQL_TRANSACTION),
            "{sql}"
        );
        let message = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert_eq!(
            message,
            format!("{action} in a read-only transaction"),
            "{sql}"
        );
    }
}
