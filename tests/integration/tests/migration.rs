//! Moving from the portable edition to the compiled one keeps policies, overrides and buckets: a database
//! using the portable edition (installed by its owner, as on a managed service) is moved with
//! portable/to-compiled.sql, run by a superuser where the library is installed, and answers every call as
//! it did: the same policies and overrides, each bucket's tokens, a key's block and its penalty box's
//! count, a held lease. Then `rate_limiting_request` and `take` go on from there.

use rate_limit_integration::{compiled_only, conninfo, Edition, TestDb, PORTABLE_OWNER};

/// The stored rows, exactly, and what `peek` answers of buckets that refill too slowly to change while
/// the test runs (one token a day; a window of 400 days), as text.
const STATE: &str = "
SELECT string_agg(x, ' ' ORDER BY x) FROM (
  SELECT format('%s/%s:%s', p.name, k.key, (d.allowed, d.remaining, d.\"limit\", d.retry_after IS NULL))
  FROM rate_limit.policies AS p, (VALUES ('alice'), ('bob')) AS k(key),
       LATERAL rate_limit.peek(p.name, k.key) AS d
  WHERE p.name IN ('daily', 'yearly', 'login')
  UNION ALL SELECT 'row:' || format('%s/%s/%s/%s/%s/%s/%s/%s', namespace, key, level, updated_at, algorithm, rate,
                                    per_us, burst) FROM rate_limit.bucket_state
  UNION ALL SELECT 'policy:' || format('%s %s %s %s %s %s %s %s %s %s %s', name, algorithm, rate, per, burst, store,
                                       created_at, changed_at, max_debt, time_zone, block_after)
            FROM rate_limit.policies
  UNION ALL SELECT 'override:' || format('%s %s %s %s %s', policy, key, action, burst, set_at)
            FROM rate_limit.key_overrides) AS s(x)";

#[test]
fn the_portable_editions_policies_overrides_and_buckets_move_to_the_compiled_one() {
    if compiled_only("the compiled edition's library, to move to") {
        return;
    }
    let db = TestDb::with_edition(&conninfo(), "migration", Edition::Portable);
    // the owner's policies and overrides, and calls that leave buckets (one a day: nothing refills)
    db.connect_as(PORTABLE_OWNER)
        .batch_execute(
            "SELECT rate_limit.create_policy('daily', 1, '1 day', burst => 5, max_debt => 3);
             SELECT rate_limit.create_policy('yearly', 4, '400 days', algorithm => 'fixed_window');
             SELECT rate_limit.create_policy('monthly', 10, '1 month', algorithm => 'calendar_window',
                                             time_zone => 'Europe/Paris');
             SELECT rate_limit.create_policy('login', 1, '1 day', burst => 1, block_after => 2, block_for => '1 day');
             SELECT rate_limit.create_policy('later_in_memory', 3, '1 day', store => 'memory');
             SELECT rate_limit.create_policy('jobs', 2, '1 day', algorithm => 'concurrency');
             SELECT rate_limit.set_override('daily', 'bob', burst => 2);",
        )
        .expect("the owner's policies");
    let mut app = db.connect();
    app.batch_execute(
        "SELECT rate_limit.take('daily', 'alice', 2);
         SELECT rate_limit.charge('daily', 'bob', 3);
         SELECT rate_limit.take('yearly', 'alice', 3);
         SELECT rate_limit.take('monthly', 'alice', 4);
         SELECT rate_limit.take('login', 'bob') FROM generate_series(1, 3);
         SELECT rate_limiting_request('client', 1, 3600) FROM generate_series(1, 7);",
    )
    .expect("calls");
    let lease: i64 = app
        .query_one("SELECT lease FROM rate_limit.acquire('jobs', 'alice')", &[])
        .expect("acquire")
        .get(0);
    let before: String = app.query_one(STATE, &[]).expect("before").get(0);
    assert!(before.contains("login/bob:(f,0,1,f)"), "{before}");
    drop(app);

    // the move, by a superuser, in one transaction
    db.connect()
        .batch_execute(&format!(
            "BEGIN; {} COMMIT;",
            include_str!("../../../portable/to-compiled.sql")
        ))
        .expect("portable/to-compiled.sql");

    let mut app = db.connect();
    let edition: String = app
        .query_one(
            "SELECT extname FROM pg_extension WHERE extname LIKE 'rate_limit%'",
            &[],
        )
        .expect("the extension")
        .get(0);
    assert_eq!(edition, "rate_limit");
    let after: String = app.query_one(STATE, &[]).expect("after").get(0);
    assert_eq!(after, before, "every answer is the same after the move");
    // the held lease is still held and still its holder's to release
    let released: bool = app
        .query_one("SELECT rate_limit.release('jobs', 'alice', $1)", &[&lease])
        .expect("release")
        .get(0);
    assert!(released);
    // and the calls go on from where they were (7 of 3 600 taken, one a second refilled since)
    let left: i32 = app
        .query_one("SELECT rate_limiting_request('client', 1, 3600)", &[])
        .expect("request")
        .get(0);
    assert!((3592..3599).contains(&left), "{left} left");
    let denied: bool = !app
        .query_one("SELECT allowed FROM rate_limit.take('daily', 'bob')", &[])
        .expect("take")
        .get::<_, bool>(0);
    assert!(denied, "bob's bucket is in debt, as it was");
}
