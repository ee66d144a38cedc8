//! Helpers for the integration tests: each test gets a fresh database with `rate_limit` installed, on the
//! server named by `RATE_LIMIT_TEST_CONNINFO` (started by `scripts/test.sh`; e.g.
//! `host=/var/tmp/rate_limit-test port=5515 user=postgres`).

use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, IsolationLevel, NoTls};

/// The connection string of the server under test, without a database name.
pub fn conninfo() -> String {
    std::env::var("RATE_LIMIT_TEST_CONNINFO").unwrap_or_else(|_| {
        panic!(
            "RATE_LIMIT_TEST_CONNINFO is not set: run the integration tests through scripts/test.sh, \
             which starts a server with rate_limit installed"
        )
    })
}

/// A database of its own for one test, dropped when the test ends.
pub struct TestDb {
    name: String,
}

impl TestDb {
    /// Creates database `rl_it_<name>` (dropping a leftover one) and installs the extension in it.
    pub fn new(name: &str) -> TestDb {
        let name = format!("rl_it_{name}");
        let mut admin = Client::connect(&format!("{} dbname=postgres", conninfo()), NoTls)
            .expect("connect to the test server");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .expect("drop a leftover test database");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create the test database");
        let db = TestDb { name };
        db.connect()
            .batch_execute("CREATE EXTENSION rate_limit")
            .expect("create the extension");
        db
    }

    /// A new connection to this test's database.
    pub fn connect(&self) -> Client {
        Client::connect(&format!("{} dbname={}", conninfo(), self.name), NoTls)
            .expect("connect to the test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&format!("{} dbname=postgres", conninfo()), NoTls) {
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
