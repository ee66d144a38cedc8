//! A streaming standby promoted while clients hammer one key of the table store (`scripts/failover-pair.sh`
//! makes the pair; `scripts/test.sh` runs this for PostgreSQL 15):
//!
//! - synchronous replication: no token is granted twice across the failover: granted before and after +
//!   tokens left <= burst + rate × elapsed;
//! - asynchronous replication: what the promoted standby had not received is granted again; measured and
//!   printed (docs/scaling.md reports it);
//! - a standby whose wall clock is an hour behind or ahead of the old primary's measures the skew while
//!   streaming and, promoted, reads the rows on the old primary's clock: buckets neither freeze nor refill
//!   a burst (`rate_limit.clock_shift()`, src/clock_shift.rs).
//!
//! `RATE_LIMIT_TEST_FAILOVER` is the command that runs `scripts/failover-pair.sh VERSION` (or `none`);
//! `RATE_LIMIT_TEST_FAILOVER_PRIMARY` and `_STANDBY` the two servers' connection strings.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use rate_limit_integration::{env, most_refilled};

const RATE: u64 = 50;
const BURST: u64 = 50;

/// `failover-pair.sh VERSION` with `args`, or `None` when this run skips failover tests.
fn pair(args: &str) -> Option<()> {
    let command = env("RATE_LIMIT_TEST_FAILOVER");
    if command == "none" {
        eprintln!(
            "failover tests skipped for this PostgreSQL version (scripts/test.sh runs them on 15)"
        );
        return None;
    }
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("{command} {args}"))
        .status()
        .expect("failover-pair.sh");
    assert!(status.success(), "failover-pair.sh {args} failed");
    Some(())
}

fn connect(server: &str) -> Result<Client, postgres::Error> {
    Client::connect(&format!("{server} dbname=postgres"), NoTls)
}

fn primary() -> String {
    env("RATE_LIMIT_TEST_FAILOVER_PRIMARY")
}

fn standby() -> String {
    env("RATE_LIMIT_TEST_FAILOVER_STANDBY")
}

/// The extension and a table-store policy on the primary, replicated before the test goes on.
fn set_up(policy: &str, rate: u64, burst: u64) -> Client {
    let mut p = connect(&primary()).expect("the primary");
    p.batch_execute(&format!(
        "CREATE EXTENSION rate_limit; \
         SELECT rate_limit.create_policy('{policy}', {rate}, '1 second', burst => {burst}, store => 'table')"
    ))
    .expect("extension and policy");
    p
}

/// What a failover under 16 hammering clients gave: tokens granted (acknowledged to a client), whole tokens
/// left after it, and the most that refilled from the first call to the final read.
struct Outcome {
    granted: u64,
    granted_after: u64,
    left: u64,
    most: u64,
}

/// Hammers key `k` of policy `hot` from 16 connections for 4 seconds; the primary dies and the standby is
/// promoted after 1.5 seconds, and the clients carry on against it (their failed calls count as not granted).
fn hammer_through_failover() -> Outcome {
    let mut p = set_up("hot", RATE, BURST);
    let before_first = Instant::now();
    let allowed: bool = p
        .query_one("SELECT allowed FROM rate_limit.take('hot', 'k')", &[])
        .expect("first call")
        .get(0);
    assert!(allowed);
    let granted = Arc::new(AtomicU64::new(1));
    let granted_after = Arc::new(AtomicU64::new(0));
    let promoted = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + Duration::from_secs(4);
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (granted, granted_after, promoted) =
                (granted.clone(), granted_after.clone(), promoted.clone());
            thread::spawn(move || {
                let mut client = connect(&primary()).ok();
                while Instant::now() < until {
                    let Some(c) = client.as_mut() else {
                        thread::sleep(Duration::from_millis(20));
                        client = connect(&standby()).ok();
                        continue;
                    };
                    match c.query_one("SELECT allowed FROM rate_limit.take('hot', 'k')", &[]) {
                        Ok(row) => {
                            if row.get::<_, bool>(0) {
                                granted.fetch_add(1, Ordering::Relaxed);
                                if promoted.load(Ordering::Relaxed) {
                                    granted_after.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        // the primary died, or the standby is not promoted yet (25006): go to the standby
                        Err(_) => client = None,
                    }
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(1500));
    drop(p);
    pair("promote").expect("set up already");
    promoted.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a hammering client");
    }
    let mut s = connect(&standby()).expect("the promoted standby");
    let left: i64 = s
        .query_one("SELECT remaining FROM rate_limit.peek('hot', 'k')", &[])
        .expect("peek")
        .get(0);
    let most = BURST + most_refilled(RATE as f64, before_first.elapsed());
    Outcome {
        granted: granted.load(Ordering::Relaxed),
        granted_after: granted_after.load(Ordering::Relaxed),
        left: u64::try_from(left).expect("tokens left"),
        most,
    }
}

#[test]
fn failover_with_synchronous_replication_grants_no_token_twice() {
    if pair("start sync +0").is_none() {
        return;
    }
    let o = hammer_through_failover();
    pair("stop");
    eprintln!(
        "sync failover: granted {} ({} after promotion) + left {} = {}, at most {}",
        o.granted,
        o.granted_after,
        o.left,
        o.granted + o.left,
        o.most
    );
    assert!(o.granted_after > 0, "the promoted standby served the key");
    assert!(o.granted > BURST, "the key was hammered");
    assert!(
        o.granted + o.left <= o.most,
        "granted {} + left {} > burst + rate x elapsed = {}",
        o.granted,
        o.left,
        o.most
    );
}

#[test]
fn failover_with_asynchronous_replication_loses_at_most_what_was_not_received() {
    if pair("start async +0").is_none() {
        return;
    }
    let o = hammer_through_failover();
    pair("stop");
    let twice = (o.granted + o.left).saturating_sub(o.most);
    eprintln!(
        "async failover: granted {} ({} after promotion) + left {} = {}, at most {}: {} granted twice",
        o.granted,
        o.granted_after,
        o.left,
        o.granted + o.left,
        o.most,
        twice
    );
    assert!(o.granted_after > 0, "the promoted standby served the key");
    // what the standby had not received was granted by the old primary only: it can be granted again, but
    // never more than the old primary granted
    assert!(
        twice <= o.granted - o.granted_after,
        "{twice} granted twice"
    );
}

/// Drains a bucket (2 tokens per second, burst 10: what refills in the test's two seconds is well short of
/// the burst) on the primary, promotes a standby whose clock is
/// `skew` off, and returns how many calls the new primary grants in the first half second after promotion,
/// and the real time that took since the drain.
fn after_a_skewed_promotion(skew: &str) -> Option<(u64, Duration)> {
    pair(&format!("start sync {skew}"))?;
    let mut p = set_up("slow", 2, 10);
    let mut granted = 0;
    while p
        .query_one("SELECT allowed FROM rate_limit.take('slow', 'k')", &[])
        .expect("drain")
        .get::<_, bool>(0)
    {
        granted += 1;
    }
    assert!(granted >= 10, "a new bucket grants its burst");
    let drained = Instant::now();
    drop(p);
    let measured = standby_clock_shift_once_sampled();
    eprintln!("the standby's clock shift, measured while streaming: {measured} s (skew {skew})");
    pair("promote")?;
    let mut s = connect(&standby()).expect("the promoted standby");
    let mut granted = 0;
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        if s.query_one("SELECT allowed FROM rate_limit.take('slow', 'k')", &[])
            .expect("take on the new primary")
            .get::<_, bool>(0)
        {
            granted += 1;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let elapsed = drained.elapsed();
    pair("stop");
    Some((granted, elapsed))
}

/// The standby's table clock shift (seconds) once its launcher has sampled the skew: within a second of
/// the hour either way (the skew plus the shortest transit), waited for up to 10 s (it samples every second).
fn standby_clock_shift_once_sampled() -> f64 {
    let mut s = connect(&standby()).expect("the standby");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        // (the extension may not be replayed yet: synchronous replication waits for the flush, not the replay)
        let shift: f64 = s
            .query_one(
                "SELECT extract(epoch FROM rate_limit.clock_shift())::float8",
                &[],
            )
            .map_or(0.0, |row| row.get(0));
        if (shift.abs() - 3600.0).abs() < 1.0 {
            return shift;
        }
        assert!(
            Instant::now() < until,
            "the standby measured no skew: {shift} s"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_promoted_standby_whose_clock_is_behind_does_not_freeze_buckets() {
    let Some((granted, elapsed)) = after_a_skewed_promotion("-1h") else {
        return;
    };
    eprintln!("clock 1 h behind: {granted} granted in {elapsed:?} after the drain");
    // refill resumes at the limit's rate from the promotion: tokens within the half second of calls, not an
    // hour later; never more than refilled since the drain
    assert!(granted >= 1, "frozen: nothing granted");
    assert!(granted <= most_refilled(2.0, elapsed) + 1);
}

#[test]
fn a_promoted_standby_whose_clock_is_ahead_grants_no_burst() {
    let Some((granted, elapsed)) = after_a_skewed_promotion("+1h") else {
        return;
    };
    eprintln!("clock 1 h ahead: {granted} granted in {elapsed:?} after the drain");
    // the promoted standby reads the rows on the old primary's clock: what refilled since the drain (an
    // hour read as idle would refill the whole burst of 10)
    assert!(granted >= 1, "frozen: nothing granted");
    assert!(
        granted <= most_refilled(2.0, elapsed) + 1,
        "{granted} granted: a burst"
    );
}

#[test]
fn the_memory_store_is_each_servers_own_across_a_promotion() {
    if pair("start async +0").is_none() {
        return;
    }
    let mut p = set_up("unused", 1, 1);
    p.batch_execute(
        "SELECT rate_limit.create_policy('mem', 1, '1 hour', burst => 3, store => 'memory')",
    )
    .expect("a memory-store policy");
    let take = |c: &mut Client, key: &str| -> bool {
        c.query_one("SELECT allowed FROM rate_limit.take('mem', $1)", &[&key])
            .expect("take")
            .get(0)
    };
    // wait until the standby has the policy
    let mut s = connect(&standby()).expect("the standby");
    let deadline = Instant::now() + Duration::from_secs(10);
    while s
        .query_one(
            "SELECT count(*) FROM rate_limit.policies WHERE name = 'mem'",
            &[],
        )
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0) // the extension may not be there yet either
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the policy never reached the standby"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // the old primary drains "a"; the standby, read-only, limits "b" in its own memory
    for _ in 0..3 {
        assert!(take(&mut p, "a"));
    }
    assert!(!take(&mut p, "a"));
    for _ in 0..2 {
        assert!(
            take(&mut s, "b"),
            "a hot standby grants from its memory store"
        );
    }
    drop((p, s));
    pair("promote").expect("set up already");
    let mut s = connect(&standby()).expect("the promoted standby");
    // "b" carries on where the standby left it; "a" was never in this server's memory: a full bucket
    assert!(take(&mut s, "b"));
    assert!(!take(&mut s, "b"));
    for _ in 0..3 {
        assert!(take(&mut s, "a"), "memory buckets are not replicated");
    }
    assert!(!take(&mut s, "a"));
    pair("stop");
}
