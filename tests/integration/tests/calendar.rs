//! A monthly quota crosses a real month boundary, in both stores, on the faketime server: its wall clock is
//! set a few seconds before 1 March 2027 00:00 in Paris (the end of a 28-day February) and the server
//! restarted on it (the memory store's clock is anchored to the wall clock at the start), then the test
//! waits for midnight:
//! - before it, the quota of 3 is used up, and the denial's `retry_after` is the seconds left until
//!   midnight in Paris;
//! - after it, the quota is whole again, and the new window ends on 1 April 00:00 in Paris: 31 days less
//!   the hour the clocks go forward on 28 March.
//!
//! The server's clock is put back (`+0`, restarted) at the end, whatever happened.
//!
//! And on the main server: a yearly quota of 100 hammered by 8 connections grants exactly 100, in both
//! stores (the calendar window goes through the same store paths as every algorithm).

use std::fs;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postgres::Client;
use rate_limit_integration::{env, run_env_command, stores, TestDb};

#[test]
fn a_quota_hammered_by_8_connections_grants_exactly_its_rate() {
    let db = TestDb::new("calendar_hammer");
    let mut c = db.connect();
    for store in stores() {
        let policy = format!("year_{store}");
        c.execute(
            "SELECT rate_limit.create_policy($1, 100, '1 year', store => $2, \
               algorithm => 'calendar_window', time_zone => 'Pacific/Auckland')",
            &[&policy, &store],
        )
        .expect("policy");
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let mut client = db.connect();
                let policy = policy.clone();
                thread::spawn(move || {
                    (0..60)
                        .filter(|_| {
                            client
                                .query_one(
                                    "SELECT allowed FROM rate_limit.take($1, 'tenant')",
                                    &[&policy],
                                )
                                .expect("take")
                                .get::<_, bool>(0)
                        })
                        .count()
                })
            })
            .collect();
        let granted: usize = handles
            .into_iter()
            .map(|h| h.join().expect("a hammering connection"))
            .sum();
        let left: i64 = c
            .query_one(
                "SELECT remaining FROM rate_limit.peek($1, 'tenant')",
                &[&policy],
            )
            .expect("peek")
            .get(0);
        // (a run across New Year's midnight in Auckland would see two windows: not this year)
        assert_eq!(
            (granted, left),
            (100, 0),
            "{store}: 480 asked of a quota of 100"
        );
    }
}

/// What the decision of a take says, in seconds.
struct Take {
    allowed: bool,
    remaining: i64,
    retry_after: Option<f64>,
    reset_after: f64,
}

fn take(client: &mut Client, policy: &str) -> Take {
    let row = client
        .query_one(
            "SELECT allowed, remaining, extract(epoch FROM retry_after)::float8, \
                    extract(epoch FROM reset_after)::float8 \
             FROM rate_limit.take($1, 'customer')",
            &[&policy],
        )
        .expect("take");
    Take {
        allowed: row.get(0),
        remaining: row.get(1),
        retry_after: row.get(2),
        reset_after: row.get(3),
    }
}

/// Puts the faketime server's clock back to real time when dropped.
struct ClockBack<'a> {
    file: &'a str,
}

impl Drop for ClockBack<'_> {
    fn drop(&mut self) {
        run_env_command("RATE_LIMIT_TEST_FAKETIME_STOP");
        fs::write(self.file, "+0\n").expect("faketime file");
        run_env_command("RATE_LIMIT_TEST_FAKETIME_START");
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

#[test]
fn a_monthly_quota_turns_at_midnight_in_paris_on_the_first_of_the_month() {
    const LEAD_S: f64 = 8.0;
    let server = env("RATE_LIMIT_TEST_FAKETIME_CONNINFO");
    let file = env("RATE_LIMIT_TEST_FAKETIME_FILE");
    let db = TestDb::on(&server, "calendar");
    let midnight: f64 = db
        .connect()
        .query_one(
            "SELECT extract(epoch FROM timestamptz '2027-03-01 00:00 Europe/Paris')::float8",
            &[],
        )
        .expect("midnight")
        .get(0);
    let _back = ClockBack { file: &file };
    // the server's wall clock LEAD_S before midnight, then a start on it
    let mut attempts = 0;
    let mut c = loop {
        attempts += 1;
        run_env_command("RATE_LIMIT_TEST_FAKETIME_STOP");
        let offset = (midnight - LEAD_S - unix_now()).round() as i64;
        fs::write(&file, format!("{offset:+}\n")).expect("faketime file");
        run_env_command("RATE_LIMIT_TEST_FAKETIME_START");
        let mut c = db.connect();
        let left: f64 = c
            .query_one(
                "SELECT extract(epoch FROM timestamptz '2027-03-01 00:00 Europe/Paris' \
                   - clock_timestamp())::float8",
                &[],
            )
            .expect("time left")
            .get(0);
        if left > 3.0 {
            break c;
        }
        assert!(attempts < 3, "the restart took too long: {left} s left");
    };
    for store in stores() {
        c.execute(
            "SELECT rate_limit.create_policy('month_' || $1, 3, '1 month', store => $1, \
               algorithm => 'calendar_window', time_zone => 'Europe/Paris')",
            &[&store],
        )
        .expect("policy");
    }
    let mut retry = 0.0_f64;
    for store in stores() {
        let policy = format!("month_{store}");
        assert!(take(&mut c, &policy).allowed && take(&mut c, &policy).allowed);
        let last = take(&mut c, &policy);
        assert!(last.allowed && last.remaining == 0, "{store}");
        let denied = take(&mut c, &policy);
        assert!(!denied.allowed, "{store}: the quota is used up");
        let r = denied.retry_after.expect("a retry");
        assert!(
            r > 0.0 && r <= LEAD_S + 1.0,
            "{store}: retry_after {r} s is the time left until midnight in Paris"
        );
        assert!((r - denied.reset_after).abs() < 1e-6, "{store}");
        retry = retry.max(r);
    }
    thread::sleep(Duration::from_secs_f64(retry + 0.5));
    // 1 April 00:00 CEST is 31 days less an hour after 1 March 00:00 CET
    let march = (31.0 * 24.0 - 1.0) * 3600.0;
    for store in stores() {
        let policy = format!("month_{store}");
        let next = take(&mut c, &policy);
        assert!(next.allowed, "{store}: a new month, a new quota");
        assert_eq!(next.remaining, 2, "{store}");
        assert!(
            next.reset_after <= march && next.reset_after > march - 10.0,
            "{store}: the March window ends on 1 April in Paris: {} s left, {march} s in March",
            next.reset_after
        );
    }
}

/// Puts the faketime server's clock back to real time when dropped (no restart: the table store reads the
/// wall clock at every call, which libfaketime reads from the file each time).
struct WallClockBack<'a> {
    file: &'a str,
}

impl Drop for WallClockBack<'_> {
    fn drop(&mut self) {
        fs::write(self.file, "+0\n").expect("faketime file");
    }
}

/// A calendar policy's rate changed in one window, and a key untouched since before the change called in
/// a later window, in the table store (whose conditional UPDATE reads a policy from its numbers and the end
/// of the window open at the call): the count carried over stays in its own window, which is over, so the
/// key starts the new window fresh. Found by the differential test: the count was carried into the window
/// open at the call, the UPDATE denied what the calendar granted, and every take of the key retried until
/// it gave up with 40001.
#[test]
fn a_key_untouched_since_a_rate_change_starts_a_later_window_fresh() {
    let server = env("RATE_LIMIT_TEST_FAKETIME_CONNINFO");
    let file = env("RATE_LIMIT_TEST_FAKETIME_FILE");
    let db = TestDb::on(&server, "calendar_change");
    let _back = WallClockBack { file: &file };
    let mut c = db.connect();
    let set_clock = |at: &str| fs::write(&file, format!("{at}\n")).expect("faketime file");
    set_clock("2030-06-12 01:00:00");
    c.execute(
        "SELECT rate_limit.create_policy('daily', 2, '1 day', store => 'table', \
           algorithm => 'calendar_window', time_zone => 'Europe/Paris')",
        &[],
    )
    .expect("policy");
    let first = take(&mut c, "daily");
    assert!(first.allowed && first.remaining == 1);
    assert!(take(&mut c, "daily").allowed);
    set_clock("2030-06-12 01:20:00");
    c.execute("SELECT rate_limit.alter_policy('daily', rate => 5)", &[])
        .expect("alter");
    // within the same window the key has carried its 0 tokens over
    let same_day = take(&mut c, "daily");
    assert!(!same_day.allowed && same_day.remaining == 0);
    // (that denial wrote nothing: the row still holds the count of 2 under the old numbers)
    set_clock("2030-07-16 05:38:00");
    let later = c
        .query_one(
            "SELECT allowed, remaining FROM rate_limit.take('daily', 'customer', 2)",
            &[],
        )
        .expect("a take in a later window, not 40001");
    assert_eq!(
        (later.get::<_, bool>(0), later.get::<_, i64>(1)),
        (true, 3),
        "a fresh window of 5"
    );
}
