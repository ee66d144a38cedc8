//! State across restarts, on the small preloaded server (`rate_limit.max_buckets = 256`):
//! - a clean restart keeps the memory store's buckets (their levels), its blocks by hand, and the
//!   statistics;
//! - a crash (SIGKILL of the postmaster) loses both: nothing is saved, and the file loaded at the previous
//!   start was deleted then;
//! - a damaged or truncated file is logged and ignored: the server starts, empty;
//! - with `rate_limit.memory_snapshot_interval`, a crash loses at most that much of the memory store.
//!
//! And on the faketime server, levels are converted across the restart through the wall clock: a restart
//! an hour later (on the wall clock) finds the bucket refilled; one whose wall clock went back an hour
//! mints nothing and does not freeze.

use std::fs;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use rate_limit_integration::{env, remaining, run_env_command, TestDb};

/// SIGKILL to the small server's postmaster, then a start once its children have gone.
fn kill_postmaster_and_start(data: &str) {
    let pid = fs::read_to_string(format!("{data}/postmaster.pid")).expect("postmaster.pid");
    let pid = pid.lines().next().expect("pid line").trim().to_string();
    let killed = Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // the children notice the postmaster's death and exit; until then the start refuses
        let started = Command::new("sh")
            .arg("-c")
            .arg(env("RATE_LIMIT_TEST_SMALL_START"))
            .status()
            .expect("start");
        if started.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not start after its postmaster was killed"
        );
        thread::sleep(Duration::from_secs(1));
    }
}

/// calls, granted, denied, tokens_granted, last_denial and since of a policy, as text.
fn stats_of(client: &mut Client, policy: &str) -> Option<String> {
    client
        .query_opt(
            "SELECT format('%s %s %s %s %s %s', calls, granted, denied, tokens_granted, last_denial, since) \
             FROM rate_limit.stats WHERE policy = $1",
            &[&policy],
        )
        .expect("stats")
        .map(|r| r.get(0))
}

fn top_of(client: &mut Client, policy: &str) -> Vec<(String, i64)> {
    client
        .query(
            "SELECT key, denials FROM rate_limit.top_limited WHERE policy = $1 ORDER BY rank",
            &[&policy],
        )
        .expect("top_limited")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A policy bucket of the memory store at 2 of 5 tokens with one denial, and statistics about it.
fn write_state(db: &TestDb) -> Client {
    let mut c = db.connect();
    c.batch_execute(
        "SELECT rate_limit.create_policy('kept', 5, '400 days', store => 'memory');
         SELECT rate_limit.take('kept', 'alice', 3);
         SELECT rate_limit.take('kept', 'alice', 3);",
    )
    .expect("write state");
    assert_eq!(remaining(&mut c, "kept", "alice"), 2);
    c
}

#[test]
fn a_clean_restart_keeps_the_memory_store_and_the_statistics_a_crash_does_not() {
    let server = env("RATE_LIMIT_TEST_SMALL_CONNINFO");
    let data = env("RATE_LIMIT_TEST_SMALL_DATA");
    let db = TestDb::on(&server, "restart_keeps");
    let mut c = write_state(&db);
    let stats = stats_of(&mut c, "kept").expect("statistics of kept");
    assert!(stats.starts_with("2 1 1 3 "), "{stats}");
    let top = top_of(&mut c, "kept");
    assert_eq!(top, vec![("alice".to_string(), 1)]);
    drop(c);

    run_env_command("RATE_LIMIT_TEST_SMALL_STOP");
    run_env_command("RATE_LIMIT_TEST_SMALL_START");
    let mut c = db.connect();
    assert_eq!(
        remaining(&mut c, "kept", "alice"),
        2,
        "the bucket kept its level"
    );
    assert_eq!(
        stats_of(&mut c, "kept").as_deref(),
        Some(stats.as_str()),
        "the statistics are the same"
    );
    assert_eq!(top_of(&mut c, "kept"), top);
    drop(c);

    kill_postmaster_and_start(&data);
    let mut c = db.connect();
    assert_eq!(
        remaining(&mut c, "kept", "alice"),
        5,
        "a crash loses the memory store"
    );
    assert_eq!(stats_of(&mut c, "kept"), None, "and the statistics");
}

/// A block by hand in the memory store survives a clean restart and is still enforced (the saved bitmap
/// says its policy may hold one), under a policy without a penalty box; other keys and policies go on.
#[test]
fn a_block_by_hand_survives_a_clean_restart_in_the_memory_store() {
    let server = env("RATE_LIMIT_TEST_SMALL_CONNINFO");
    let db = TestDb::on(&server, "restart_blocks");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT rate_limit.create_policy('blocked_by_hand', 5, '1 hour', store => 'memory');
         SELECT rate_limit.create_policy('never_blocked', 5, '1 hour', store => 'memory');
         SELECT rate_limit.block('blocked_by_hand', 'mallory', '1 day');",
    )
    .expect("block");
    let allowed = |c: &mut Client, policy: &str, key: &str| -> bool {
        c.query_one(
            "SELECT allowed FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .expect("take")
        .get(0)
    };
    assert!(!allowed(&mut c, "blocked_by_hand", "mallory"));
    drop(c);

    run_env_command("RATE_LIMIT_TEST_SMALL_STOP");
    run_env_command("RATE_LIMIT_TEST_SMALL_START");
    let mut c = db.connect();
    assert!(
        !allowed(&mut c, "blocked_by_hand", "mallory"),
        "the block is still enforced after the restart"
    );
    assert!(allowed(&mut c, "blocked_by_hand", "alice"));
    assert!(allowed(&mut c, "never_blocked", "mallory"));
}

#[test]
fn damaged_files_are_logged_and_ignored() {
    let server = env("RATE_LIMIT_TEST_SMALL_CONNINFO");
    let data = env("RATE_LIMIT_TEST_SMALL_DATA");
    let db = TestDb::on(&server, "restart_damaged");
    drop(write_state(&db));
    run_env_command("RATE_LIMIT_TEST_SMALL_STOP");
    let memory = format!("{data}/pg_stat/rate_limit.memory");
    let stats = format!("{data}/pg_stat/rate_limit.stats");
    // the memory store's file cut in half, one bit of the statistics' file flipped
    let bytes = fs::read(&memory).expect("the memory store was saved");
    fs::write(&memory, &bytes[..bytes.len() / 2]).expect("truncate");
    let mut bytes = fs::read(&stats).expect("the statistics were saved");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    fs::write(&stats, &bytes).expect("damage");
    let log_before = fs::read_to_string(format!("{data}/server.log"))
        .unwrap_or_default()
        .len();
    run_env_command("RATE_LIMIT_TEST_SMALL_START");
    let mut c = db.connect();
    assert_eq!(
        remaining(&mut c, "kept", "alice"),
        5,
        "the store starts empty"
    );
    assert_eq!(stats_of(&mut c, "kept"), None, "the statistics start empty");
    let log = fs::read_to_string(format!("{data}/server.log")).expect("server log");
    let new = &log[log_before.min(log.len())..];
    assert!(
        new.contains("ignored memory-store buckets") && new.contains("ignored statistics entries"),
        "both damaged files are reported in the log:\n{new}"
    );
    assert!(!std::path::Path::new(&memory).exists() && !std::path::Path::new(&stats).exists());
}

#[test]
fn with_a_snapshot_interval_a_crash_keeps_the_last_snapshot() {
    let server = env("RATE_LIMIT_TEST_SMALL_CONNINFO");
    let data = env("RATE_LIMIT_TEST_SMALL_DATA");
    let db = TestDb::on(&server, "restart_snapshot");
    let mut c = write_state(&db);
    // one statement per call: ALTER SYSTEM cannot run in the transaction of a multi-statement string
    c.batch_execute("ALTER SYSTEM SET rate_limit.memory_snapshot_interval = '1s'")
        .expect("snapshot every second");
    let reloaded = std::time::SystemTime::now();
    c.batch_execute("SELECT pg_reload_conf()").expect("reload");
    // a snapshot written after the reload holds the state written before it
    let snapshot = format!("{data}/pg_stat/rate_limit.memory");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !fs::metadata(&snapshot)
        .and_then(|m| m.modified())
        .is_ok_and(|written| written >= reloaded)
    {
        assert!(Instant::now() < deadline, "no snapshot written within 60 s");
        thread::sleep(Duration::from_millis(50));
    }
    drop(c);
    kill_postmaster_and_start(&data);
    let mut c = db.connect();
    c.batch_execute("ALTER SYSTEM RESET rate_limit.memory_snapshot_interval")
        .expect("reset the interval");
    c.batch_execute("SELECT pg_reload_conf()").expect("reload");
    assert_eq!(
        remaining(&mut c, "kept", "alice"),
        2,
        "the snapshot taken before the crash was loaded"
    );
}

/// On the faketime server: a memory-store policy of 1 token per second, burst 10, emptied before each
/// restart.
#[test]
fn levels_are_converted_through_the_wall_clock_across_a_restart() {
    let server = env("RATE_LIMIT_TEST_FAKETIME_CONNINFO");
    let file = env("RATE_LIMIT_TEST_FAKETIME_FILE");
    let set_clock = |offset: &str| fs::write(&file, format!("{offset}\n")).expect("faketime file");
    let db = TestDb::on(&server, "restart_clock");
    let empty = |c: &mut Client| {
        let left: i64 = c
            .query_one(
                "SELECT remaining FROM rate_limit.take('second', 'k', 10)",
                &[],
            )
            .expect("take")
            .get(0);
        assert_eq!(left, 0);
    };
    let mut c = db.connect();
    c.batch_execute(
        "SELECT rate_limit.create_policy('second', 1, '1 second', 10, store => 'memory')",
    )
    .expect("policy");
    empty(&mut c);
    drop(c);

    // an hour passes on the wall clock while the server is down (the boot clock does not see it)
    run_env_command("RATE_LIMIT_TEST_FAKETIME_STOP");
    set_clock("+1h");
    run_env_command("RATE_LIMIT_TEST_FAKETIME_START");
    let mut c = db.connect();
    assert_eq!(
        remaining(&mut c, "second", "k"),
        10,
        "an hour later the bucket is full"
    );
    empty(&mut c);
    drop(c);

    // the wall clock goes back an hour across the restart: nothing is minted, refill goes on at once
    run_env_command("RATE_LIMIT_TEST_FAKETIME_STOP");
    set_clock("+0");
    let started = Instant::now();
    run_env_command("RATE_LIMIT_TEST_FAKETIME_START");
    let mut c = db.connect();
    let at_once = remaining(&mut c, "second", "k");
    // the bucket restarts empty at the load, after `started`: at most one token per second since then
    let since_start = started.elapsed().as_secs() as i64;
    assert!(
        at_once <= since_start,
        "{at_once} tokens minted by a backward step ({since_start} s since the start began)"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let later = remaining(&mut c, "second", "k");
        if later > at_once {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refill goes on: {at_once} then still {later} after 30 s (frozen?)"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// A fast shutdown a moment after a start never hangs: 20 times, the small preloaded server is started
/// (`pg_ctl -w start`) and fast-stopped after a random delay of 0 to 700 ms, each stop within pg_ctl's own
/// 60 s bound (the command fails past it). The launcher, if the postmaster starts it after the shutdown's
/// SIGTERM was broadcast, reads `stopping` in postmaster.pid and exits (before: twice in 28 tries the
/// postmaster waited minutes for it). At the end the server runs again with its launcher.
#[test]
fn a_fast_stop_right_after_a_start_never_hangs() {
    let server = env("RATE_LIMIT_TEST_SMALL_CONNINFO");
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(1)
        | 1;
    run_env_command("RATE_LIMIT_TEST_SMALL_STOP");
    for round in 0..20 {
        // xorshift: a different delay each round and each run
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let delay = Duration::from_millis(u64::from(seed % 700));
        run_env_command("RATE_LIMIT_TEST_SMALL_START");
        thread::sleep(delay);
        let started = Instant::now();
        run_env_command("RATE_LIMIT_TEST_SMALL_STOP");
        eprintln!(
            "round {round}: stopped {delay:?} after the start, in {:?}",
            started.elapsed()
        );
    }
    run_env_command("RATE_LIMIT_TEST_SMALL_START");
    let mut c =
        Client::connect(&format!("{server} dbname=postgres"), postgres::NoTls).expect("connect");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let launchers: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity \
                 WHERE backend_type OPERATOR(pg_catalog.=) 'rate_limit launcher'",
                &[],
            )
            .expect("launchers")
            .get(0);
        if launchers == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no launcher runs after the start"
        );
        thread::sleep(Duration::from_millis(100));
    }
}
