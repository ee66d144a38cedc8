//! Helpers for the integration tests: each test gets a fresh database with `rate_limit` installed, on the
//! server named by `RATE_LIMIT_TEST_CONNINFO` (started by `scripts/test.sh`; e.g.
//! `host=/var/tmp/rate_limit-test port=5515 user=postgres`).

use std::time::Duration;

/// The SQL surface's table (`src/surface/`, these very files): what the router, the client test and the
/// reference are checked against.
#[path = "../../../src/surface/mod.rs"]
pub mod surface;

pub mod generated;
pub mod purge;

use postgres::error::SqlState;
use postgres::{Client, IsolationLevel, NoTls};

/// The connection string of the main server under test (rate_limit preloaded), without a database name.
pub fn conninfo() -> String {
    env("RATE_LIMIT_TEST_CONNINFO")
}

/// The edition under test, from `RATE_LIMIT_TEST_EDITION`: `compiled` (the default) or `portable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edition {
    /// The extension (`CREATE EXTENSION rate_limit`).
    Compiled,
    /// `portable/rate_limit_portable.sql`, run by the database's owner, a role without superuser.
    Portable,
}

/// The edition the tests run against (see [`Edition`]).
pub fn edition() -> Edition {
    match std::env::var("RATE_LIMIT_TEST_EDITION").as_deref() {
        Err(_) | Ok("compiled") => Edition::Compiled,
        Ok("portable") => Edition::Portable,
        Ok(other) => panic!("RATE_LIMIT_TEST_EDITION must be compiled or portable, got {other:?}"),
    }
}

/// Whether `what` is a feature only the compiled edition has (docs/portable.md lists them): true when the
/// portable edition is under test, after saying the test is skipped. A test of such a feature begins with
/// `if compiled_only("...") { return; }`.
pub fn compiled_only(what: &str) -> bool {
    if edition() == Edition::Portable {
        eprintln!("skipped in the portable edition: {what}");
        return true;
    }
    false
}

/// The stores of the edition under test: the table store, and the memory store in the compiled edition.
pub fn stores() -> Vec<&'static str> {
    match edition() {
        Edition::Compiled => vec!["table", "memory"],
        Edition::Portable => vec!["table"],
    }
}

/// The portable edition's one install file, as a user downloads it.
pub const PORTABLE_SQL: &str = include_str!("../../../portable/rate_limit_portable.sql");

/// The role that owns a test database of the portable edition and installs it there: LOGIN and nothing
/// else, as a managed service's database owner.
pub const PORTABLE_OWNER: &str = "rl_portable_owner";

/// A setting `scripts/test.sh` passes to the tests (the servers it started).
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the integration tests through scripts/test.sh, which starts the \
             servers they need"
        )
    })
}

/// Runs the shell command that the setting `variable` holds (one `scripts/test.sh` passes: starting or
/// stopping a server), and fails the test if it fails.
pub fn run_env_command(variable: &str) {
    let command = env(variable);
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .status()
        .expect(variable);
    assert!(status.success(), "{variable} failed: {command}");
}

/// The servers a multi-server test file uses, from setting `variable` (connection strings separated by `;`),
/// or `None` when it is `none`: `scripts/test.sh` runs such a file only for the PostgreSQL version it names
/// in `skipped_because`.
pub fn servers_or_skip(variable: &str, skipped_because: &str) -> Option<Vec<String>> {
    let servers = env(variable);
    if servers == "none" {
        eprintln!("skipped for this PostgreSQL version: {skipped_because}");
        return None;
    }
    Some(servers.split(';').map(str::to_string).collect())
}

/// A name no earlier run used, from `prefix`: shared memory (memory buckets, statistics) outlives the test
/// databases.
pub fn fresh_name(prefix: &str) -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or_default();
    format!("{prefix}_{micros}")
}

/// A server a test stopped (with the command in setting `stop`), started again (setting `start`) when this
/// is dropped, so that a failed assertion leaves the servers whole for the next test.
pub struct StoppedServer {
    start: &'static str,
}

impl StoppedServer {
    /// Stops the server now.
    pub fn stop(stop: &str, start: &'static str) -> StoppedServer {
        run_env_command(stop);
        StoppedServer { start }
    }
}

impl Drop for StoppedServer {
    fn drop(&mut self) {
        run_env_command(self.start);
    }
}

/// A server a test froze: its postmaster and every process it started stopped with SIGSTOP (the sockets
/// stay open and the kernel keeps accepting connections, but nothing answers: a hung server), resumed with
/// SIGCONT when this is dropped.
pub struct FrozenServer {
    pids: Vec<String>,
}

impl FrozenServer {
    /// Freezes the server whose data directory setting `data_dir` names.
    pub fn freeze(data_dir: &str) -> FrozenServer {
        let pid_file = format!("{}/postmaster.pid", env(data_dir));
        let postmaster = std::fs::read_to_string(&pid_file)
            .expect("postmaster.pid")
            .lines()
            .next()
            .expect("the postmaster's pid")
            .trim()
            .to_string();
        let children = std::process::Command::new("pgrep")
            .args(["-P", &postmaster])
            .output()
            .expect("pgrep");
        let mut pids: Vec<String> = String::from_utf8_lossy(&children.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        pids.push(postmaster);
        signal("-STOP", &pids);
        FrozenServer { pids }
    }
}

impl Drop for FrozenServer {
    fn drop(&mut self) {
        signal("-CONT", &self.pids);
    }
}

fn signal(which: &str, pids: &[String]) {
    let status = std::process::Command::new("kill")
        .arg(which)
        .args(pids)
        .status()
        .expect("kill");
    assert!(status.success(), "kill {which} {pids:?}");
}

/// A database of its own for one test, dropped when the test ends.
pub struct TestDb {
    name: String,
    server: String,
}

impl TestDb {
    /// Creates database `rl_it_<name>` on the main server (dropping a leftover one) with the extension.
    pub fn new(name: &str) -> TestDb {
        TestDb::on(&conninfo(), name)
    }

    /// The same, on the server at `server` (a connection string without a database name), with the edition
    /// under test.
    pub fn on(server: &str, name: &str) -> TestDb {
        TestDb::with_edition(server, name, edition())
    }

    /// Database `rl_it_<name>` on the server at `server` (dropping a leftover one) with `edition` installed:
    /// the extension, created by the server's superuser; or the portable edition's file, run by
    /// [`PORTABLE_OWNER`], which owns the database.
    pub fn with_edition(server: &str, name: &str, edition: Edition) -> TestDb {
        let name = format!("rl_it_{name}");
        let mut admin = Client::connect(&format!("{server} dbname=postgres"), NoTls)
            .expect("connect to the test server");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .expect("drop a leftover test database");
        let owner = match edition {
            Edition::Compiled => String::new(),
            Edition::Portable => {
                admin
                    .batch_execute(&format!(
                        // two tests creating it at once: the loser sees the catalog's unique index
                        "DO $$ BEGIN CREATE ROLE {PORTABLE_OWNER} LOGIN; \
                         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
                    ))
                    .expect("create the portable edition's owner");
                format!(" OWNER {PORTABLE_OWNER}")
            }
        };
        admin
            .batch_execute(&format!("CREATE DATABASE {name}{owner}"))
            .expect("create the test database");
        let db = TestDb {
            name,
            server: server.to_string(),
        };
        match edition {
            Edition::Compiled => db
                .connect()
                .batch_execute("CREATE EXTENSION rate_limit")
                .expect("create the extension"),
            Edition::Portable => db
                .connect_as(PORTABLE_OWNER)
                .batch_execute(PORTABLE_SQL)
                .expect("install the portable edition as the database's owner"),
        }
        db
    }

    /// Removes the edition from this database, its data with it: `DROP EXTENSION rate_limit`, or the
    /// portable edition's `portable/uninstall.sql` run by its owner.
    pub fn uninstall(&self) {
        match edition() {
            Edition::Compiled => self
                .connect()
                .batch_execute("DROP EXTENSION rate_limit")
                .expect("drop the extension"),
            Edition::Portable => self
                .connect_as(PORTABLE_OWNER)
                .batch_execute(include_str!("../../../portable/uninstall.sql"))
                .expect("uninstall the portable edition"),
        }
    }

    /// Sets `rate_limit.max_wait` to `value` (`3s`): the superuser's setting in the compiled edition, for
    /// `session` alone; in the portable edition the owner's `rate_limit.max_wait()`, replaced for the
    /// whole database (every role's setting would be any role's to raise).
    pub fn set_max_wait(&self, session: &mut Client, value: &str) {
        match edition() {
            Edition::Compiled => session
                .batch_execute(&format!("SET rate_limit.max_wait = '{value}'"))
                .expect("set max_wait"),
            Edition::Portable => self
                .connect_as(PORTABLE_OWNER)
                .batch_execute(&format!(
                    "CREATE OR REPLACE FUNCTION rate_limit.max_wait() RETURNS interval \
                     LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '{value}' $$"
                ))
                .expect("replace rate_limit.max_wait()"),
        }
    }

    /// A new connection to this test's database as `role` (which may log in).
    pub fn connect_as(&self, role: &str) -> Client {
        Client::connect(
            &format!("{} dbname={} user={role}", self.server, self.name),
            NoTls,
        )
        .expect("connect as the role")
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new connection to this test's database.
    pub fn connect(&self) -> Client {
        Client::connect(&format!("{} dbname={}", self.server, self.name), NoTls)
            .expect("connect to the test database")
    }

    /// A role with only LOGIN, created afresh as `role`, and a connection to this database as that role.
    pub fn connect_as_login_role(&self, role: &str) -> Client {
        self.connect()
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN"
            ))
            .expect("create the role");
        Client::connect(
            &format!("{} dbname={} user={role}", self.server, self.name),
            NoTls,
        )
        .expect("connect as the role")
    }

    /// A new connection whose session uses the memory store.
    pub fn connect_memory(&self) -> Client {
        let mut client = self.connect();
        client
            .batch_execute("SET rate_limit.store = 'memory'")
            .expect("select the memory store");
        client
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&format!("{} dbname=postgres", self.server), NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// The isolation levels every concurrency test runs under.
pub const ISOLATION_LEVELS: [IsolationLevel; 3] = [
    IsolationLevel::ReadCommitted,
    IsolationLevel::RepeatableRead,
    IsolationLevel::Serializable,
];

/// What one committed call returned, and how many 40001 retries it took.
pub struct Committed {
    pub remaining: i32,
    pub retries: u32,
}

/// Calls `rate_limiting_request(id, rate, window)` in its own transaction at `level`, retrying on 40001
/// (serialization failure) until it commits. Any other error fails the test.
pub fn request_in_transaction(
    client: &mut Client,
    level: IsolationLevel,
    id: &str,
    rate: i32,
    window: i32,
) -> Committed {
    let mut retries = 0;
    loop {
        let result = (|| {
            let mut tx = client.build_transaction().isolation_level(level).start()?;
            let row = tx.query_one(
                "SELECT rate_limiting_request($1, $2, $3)",
                &[&id, &rate, &window],
            )?;
            let remaining: i32 = row.get(0);
            tx.commit()?;
            Ok::<i32, postgres::Error>(remaining)
        })();
        match result {
            Ok(remaining) => return Committed { remaining, retries },
            Err(e) if e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE) => {
                retries += 1;
                if retries > 10_000 {
                    panic!("more than 10000 serialization failures in a row for one call");
                }
            }
            Err(e) => panic!("unexpected error at {level:?}: {e:?}"),
        }
    }
}

/// Seconds between two server timestamps read with `clock_timestamp()`.
pub fn server_now(client: &mut Client) -> f64 {
    client
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .expect("read the server clock")
        .get(0)
}

/// Sleeps until `deadline` (an Instant), if it is still ahead.
pub fn sleep_until(deadline: std::time::Instant) {
    let now = std::time::Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// A short pause used between retries of an observation that background activity can disturb.
pub fn settle() {
    std::thread::sleep(Duration::from_millis(200));
}

/// The most whole tokens a bucket refilling `rate` tokens per second gains in `span` of real time. Tests bound
/// the grants of a burst of calls by the time they measured around it, never by an assumed speed: a loaded
/// machine makes a burst last longer, and its calls rightly get what refilled meanwhile.
pub fn most_refilled(rate: f64, span: Duration) -> u64 {
    (rate * span.as_secs_f64()).floor() as u64
}

/// One hammering connection's call: takes a token of the hammered key, returns whether it was granted.
pub type Caller = Box<dyn FnMut() -> bool + Send>;

/// Hammers `policy`/`key` (a new bucket refilling `rate` tokens per second, `burst` at most) from
/// `threads` connections at once for `seconds`, each making its calls with `caller(i)`; then checks
/// conservation: granted + whole tokens left = burst + rate × elapsed, within one token, elapsed bounded
/// by the times measured around the first call and the final read. `first` makes the first call (which
/// takes the whole burst, once every connection is made) and the read, with `rate_limit.take` and
/// `rate_limit.peek`, wherever it is connected.
pub fn hammer_conserves_tokens(
    first: &mut Client,
    (policy, key): (&str, &str),
    (rate, burst): (u64, u64),
    seconds: u64,
    threads: usize,
    caller: impl Fn(usize) -> Caller,
) {
    hammer_conserves_tokens_within(
        first,
        (policy, key),
        (rate, burst),
        seconds,
        threads,
        caller,
        (0, &[]),
    );
}

/// How long [`hammer_conserves_tokens_within`] retries a refused final read: far longer than a shard move's
/// cutover, so a read that still fails after it shows a fault, not a race.
pub const READ_RETRY_FOR: Duration = Duration::from_secs(30);

/// [`hammer_conserves_tokens`], allowing `extra` tokens more than conservation grants (what the docs
/// allow, e.g. one more burst when a memory bucket's shard moves), and retrying the final read while it
/// fails with one of `refusals` (a read racing the end of a shard move is refused like any call: 40001 or
/// 0A000, retry), for at most [`READ_RETRY_FOR`].
pub fn hammer_conserves_tokens_within(
    first: &mut Client,
    (policy, key): (&str, &str),
    (rate, burst): (u64, u64),
    seconds: u64,
    threads: usize,
    caller: impl Fn(usize) -> Caller,
    (extra, refusals): (u64, &[SqlState]),
) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Instant;
    // every connection is made before the first call, which takes the whole burst: from then on the bucket
    // holds fewer tokens than its burst, so no refill is lost at the cap, however late the threads start
    let callers: Vec<Caller> = (0..threads).map(caller).collect();
    let cost = i32::try_from(burst).expect("a burst that fits a cost");
    let before_first = Instant::now();
    let allowed: bool = first
        .query_one(
            "SELECT allowed FROM rate_limit.take($1, $2, $3)",
            &[&policy, &key, &cost],
        )
        .expect("the first call")
        .get(0);
    let after_first = Instant::now();
    assert!(allowed, "a new bucket grants its burst");
    let granted = Arc::new(AtomicU64::new(burst));
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = callers
        .into_iter()
        .map(|mut call| {
            let (granted, start) = (granted.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let until = Instant::now() + Duration::from_secs(seconds);
                while Instant::now() < until {
                    if call() {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a hammering connection");
    }
    let before_read = Instant::now();
    let left: i64 = loop {
        match first.query_one(
            "SELECT remaining FROM rate_limit.peek($1, $2)",
            &[&policy, &key],
        ) {
            Ok(row) => break row.get(0),
            Err(e)
                if e.code().is_some_and(|code| refusals.contains(code))
                    && before_read.elapsed() < READ_RETRY_FOR =>
            {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("peek: {e:?}"),
        }
    };
    let after_read = Instant::now();
    let granted = granted.load(Ordering::Relaxed);
    let total = granted + u64::try_from(left).expect("tokens left");
    let most = burst + most_refilled(rate as f64, after_read - before_first) + extra;
    let least = burst + most_refilled(rate as f64, before_read - after_first);
    assert!(
        total <= most && total + 1 >= least,
        "{policy}/{key}: granted {granted} + left {left} = {total}, expected {least}..={most}"
    );
    assert!(granted > burst, "the key was hammered: {granted} granted");
}

/// The exact tokens in bucket `id` (50 tokens/s, capacity 200; to the millionth, `rate_limit.tokens`, in
/// the session's store) and the server's clock just before and just after the call that read them, in
/// seconds: the instant the tokens are for lies between the two (a session's first call of a PL/pgSQL
/// function compiles it, which can take milliseconds on a loaded machine, so one clock read on one side
/// does not date them).
pub fn tokens_now(client: &mut Client, id: &str) -> (f64, f64, f64) {
    let row = client
        .query_one(
            "SELECT extract(epoch FROM clock_timestamp())::float8, rate_limit.tokens($1, 50, 4)::float8, \
                    extract(epoch FROM clock_timestamp())::float8",
            &[&id],
        )
        .expect("read the bucket");
    (row.get(1), row.get(0), row.get(2))
}

/// Floods bucket `id` (50 tokens/s, capacity 200) from `connections` connections for 4 seconds, each call
/// its own transaction at `level` (40001 retried), on the memory store if `memory`, and checks exactness:
/// - a new bucket grants exactly its capacity (one statement drains it), plus what refilled while that
///   statement ran (rate × its duration: a loaded machine makes it last longer);
/// - then granted + tokens left = tokens at the start + rate × elapsed, within 2% or 2 tokens, and
///   granted never exceeds it (the flood starts from an empty bucket, so it never refills to the cap,
///   where refill is rightly wasted and conservation would not hold);
/// - the bucket was really flooded and kept drained (at most the tolerance left, plus what refilled
///   between the flood's stop and the final read, while the workers finished their last calls).
pub fn flood(
    db: &std::sync::Arc<TestDb>,
    id: &str,
    connections: usize,
    level: IsolationLevel,
    memory: bool,
) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};

    let (rate, window) = (50, 4);
    // the memory store outlives test databases: a fresh id per run
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or_default();
    let id = &format!("{id}_{nonce}");
    let open = move |db: &TestDb| {
        if memory {
            db.connect_memory()
        } else {
            db.connect()
        }
    };
    let granted = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(connections + 1));
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (db, id) = (Arc::clone(db), id.to_string());
            let (granted, calls, retries) = (granted.clone(), calls.clone(), retries.clone());
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || {
                let mut client = open(&db);
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    let c = request_in_transaction(&mut client, level, &id, rate, window);
                    calls.fetch_add(1, Ordering::Relaxed);
                    retries.fetch_add(u64::from(c.retries), Ordering::Relaxed);
                    if c.remaining >= 0 {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut clock = open(db);
    // a first read compiles what rate_limit.tokens runs, so that the two dated reads below are quick
    tokens_now(&mut clock, id);
    let draining = std::time::Instant::now();
    let drained: i64 = clock
        .query_one(
            "SELECT count(*) FILTER (WHERE rate_limiting_request($1, $2::int, $3::int) >= 0) \
             FROM generate_series(1, $2::int * $3::int + 50)",
            &[&id, &rate, &window],
        )
        .expect("drain the bucket")
        .get(0);
    // The statement's calls read the clock one by one, so tokens refilled while it ran are rightly granted
    // too: at most rate x its duration, which the client's measure of the round trip bounds from above.
    let drain_time = draining.elapsed();
    let capacity = i64::from(rate * window);
    let refilled = most_refilled(f64::from(rate), drain_time) as i64;
    assert!(
        (capacity..=capacity + refilled).contains(&drained),
        "{id}: a new bucket granted {drained} calls in a row in {drain_time:?}, capacity is {capacity} \
         and at most {refilled} tokens came back meanwhile"
    );
    // the bucket's level at the start and the end, each dated by the clock reads around it
    let (at_start, before_start, after_start) = tokens_now(&mut clock, id);
    start.wait();
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let stopped = std::time::Instant::now();
    for w in workers {
        w.join().expect("worker thread");
    }
    let (left, before_end, after_end) = tokens_now(&mut clock, id);
    // from the stop to the read, the workers finish their last calls (retries included) and nobody takes:
    // what refills meanwhile is left in the bucket however well the flood kept it drained
    let refilled_after_the_stop = most_refilled(f64::from(rate), stopped.elapsed()) as f64;
    let granted = granted.load(Ordering::Relaxed) as f64;
    let calls = calls.load(Ordering::Relaxed) as f64;
    // granted + left = at_start + rate x (the end's instant - the start's instant), which lie in these bounds
    let most = at_start + f64::from(rate) * (after_end - before_start);
    let least = at_start + f64::from(rate) * (before_end - after_start);
    let expected = (most + least) / 2.0;
    let tolerance = (expected * 0.02).max(2.0);
    eprintln!(
        "{id} ({connections} connections, {level:?}): {calls} calls, {granted} granted, {left:.3} left, \
         expected {least:.3}..={most:.3}, {} retries",
        retries.load(Ordering::Relaxed)
    );
    assert!(
        granted <= most.floor(),
        "{id}: granted {granted} > tokens at start + rate x elapsed = {most:.3} at most"
    );
    assert!(
        (granted + left - expected).abs() <= tolerance,
        "{id}: granted {granted} + left {left:.3}, expected {expected:.1} ± {tolerance:.1}"
    );
    assert!(
        left <= tolerance + refilled_after_the_stop,
        "{id}: {left:.3} tokens left ({refilled_after_the_stop} refilled after the stop): the flood did not \
         keep the bucket drained"
    );
    assert!(
        calls > granted * 1.5,
        "{id}: the key was not flooded ({calls} calls)"
    );
}

/// Remaining tokens of (policy, key), read without taking.
pub fn remaining(client: &mut Client, policy: &str, key: &str) -> i64 {
    client
        .query_one(
            "SELECT remaining FROM rate_limit.peek($1, $2)",
            &[&policy, &key],
        )
        .expect("peek")
        .get(0)
}

/// One column of `rate_limit.memory_usage()`, e.g. `buckets` or `share_buckets`.
pub fn memory_usage(client: &mut Client, column: &str) -> i64 {
    client
        .query_one(
            &format!("SELECT {column} FROM rate_limit.memory_usage()"),
            &[],
        )
        .expect("memory_usage")
        .get(0)
}

/// An error of one step of an interleaving: (session, step, SQLSTATE or message).
pub type StepError = (usize, usize, String);

/// A session's thread, as the driver holds it: where its steps go, and where its answers come from.
type SessionChannels = (
    std::sync::mpsc::Sender<String>,
    std::sync::mpsc::Receiver<Result<(), String>>,
);

/// Every interleaving of two sessions' scripts, as PostgreSQL's isolation tester runs them: for each
/// order of the steps (each script keeps its own order), the steps are sent one at a time; a step that
/// has not answered within 300 ms is taken as waiting for a lock, and the other session goes on (a step
/// of a waiting session waits its turn). `{key}` in a step is replaced by a key of that interleaving's
/// own. Returns, per interleaving, the order (0: first script, 1: second) and every error as
/// (session, step, SQLSTATE or message); `connect` opens a session.
pub fn interleavings(
    connect: impl Fn() -> Client,
    scripts: [&[&str]; 2],
    before_each: impl Fn(&mut Client, &str),
) -> Vec<(Vec<usize>, Vec<StepError>)> {
    use std::sync::mpsc;
    let orders = orders_of(scripts[0].len(), scripts[1].len());
    let mut results = Vec::with_capacity(orders.len());
    for (n, order) in orders.into_iter().enumerate() {
        let key = format!("{}_{n}", fresh_name("il"));
        before_each(&mut connect(), &key);
        // one thread per session: it runs what it is sent and answers each step
        let sessions: Vec<_> = (0..2)
            .map(|_| {
                let (to_session, steps) = mpsc::channel::<String>();
                let (answer, answers) = mpsc::channel::<Result<(), String>>();
                let mut client = connect();
                std::thread::spawn(move || {
                    for sql in steps {
                        let r = client.simple_query(&sql).map(|_| ()).map_err(|e| {
                            e.code()
                                .map_or_else(|| e.to_string(), |c| c.code().to_string())
                        });
                        if answer.send(r).is_err() {
                            break;
                        }
                    }
                });
                (to_session, answers)
            })
            .collect();
        let mut driver = Driver {
            sessions: &sessions,
            scripts,
            key: &key,
            sent: [0; 2],
            answered: [0; 2],
            errors: Vec::new(),
        };
        let mut wanted = [0_usize; 2];
        for &s in &order {
            wanted[s] += 1;
            driver.drive(&wanted, Duration::from_millis(300));
        }
        let all = [scripts[0].len(), scripts[1].len()];
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while driver.answered != all {
            assert!(
                std::time::Instant::now() < deadline,
                "interleaving {order:?}: the sessions still wait after 30 s"
            );
            if !driver.drive(&all, Duration::from_millis(300)) {
                std::thread::sleep(Duration::from_millis(20)); // both wait: a lock, or the deadlock detector
            }
        }
        let errors = driver.errors;
        results.push((order, errors));
    }
    results
}

/// The steps of two sessions under way: what each was sent and has answered, and the errors.
struct Driver<'a> {
    sessions: &'a [SessionChannels],
    scripts: [&'a [&'a str]; 2],
    key: &'a str,
    sent: [usize; 2],
    answered: [usize; 2],
    errors: Vec<StepError>,
}

impl Driver<'_> {
    /// Collects the answers that came, and sends each session its next step once it has answered the
    /// last, until each has been sent `wanted` steps or is waiting: a step just sent has `patience` to
    /// answer, and one still running then is taken as waiting for a lock (it is looked at again without
    /// waiting). Returns whether anything happened.
    fn drive(&mut self, wanted: &[usize; 2], patience: Duration) -> bool {
        let mut any = false;
        loop {
            let mut progress = false;
            for (s, &wanted) in wanted.iter().enumerate() {
                if self.sent[s] > self.answered[s] {
                    if let Ok(r) = self.sessions[s].1.try_recv() {
                        self.record(s, r);
                        progress = true;
                    }
                }
                if self.sent[s] == self.answered[s] && self.sent[s] < wanted {
                    let sql = self.scripts[s][self.sent[s]].replace("{key}", self.key);
                    self.sessions[s].0.send(sql).expect("send a step");
                    self.sent[s] += 1;
                    progress = true;
                    if let Ok(r) = self.sessions[s].1.recv_timeout(patience) {
                        self.record(s, r);
                    }
                }
            }
            if !progress {
                return any;
            }
            any = true;
        }
    }

    /// Counts the answer of session `s`'s step under way, keeping its error.
    fn record(&mut self, s: usize, answer: Result<(), String>) {
        if let Err(code) = answer {
            self.errors.push((s, self.answered[s], code));
        }
        self.answered[s] += 1;
    }
}

/// Asserts that [`interleavings`] ran `count` interleavings and that every step of each answered without
/// an error (no 40P01, no lock timeout).
pub fn assert_every_interleaving_answers(
    runs: &[(Vec<usize>, Vec<StepError>)],
    count: usize,
    what: &str,
) {
    assert_eq!(runs.len(), count, "{what}");
    for (order, errors) in runs {
        assert!(errors.is_empty(), "{what}: {order:?}: {errors:?}");
    }
}

/// Every sequence of `a` zeros and `b` ones.
fn orders_of(a: usize, b: usize) -> Vec<Vec<usize>> {
    if a == 0 || b == 0 {
        return vec![[vec![0; a], vec![1; b]].concat()];
    }
    let mut all = Vec::new();
    for mut rest in orders_of(a - 1, b) {
        rest.insert(0, 0);
        all.push(rest);
    }
    for mut rest in orders_of(a, b - 1) {
        rest.insert(0, 1);
        all.push(rest);
    }
    all
}
