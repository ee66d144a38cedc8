//! Clock steps neither mint nor freeze. The server under test runs with libfaketime preloaded into the
//! postmaster (`FAKETIME_TIMESTAMP_FILE`, re-read at every clock read; monotonic clocks not faked, as an
//! NTP step or a VM restore leaves them), so the test steps the server's wall clock by writing the file.
//!
//! For both stores, for `rate_limiting_request` and a policy (10 tokens per second, burst 10), in both
//! orders (+1 hour then back; -1 hour then back), counting grants against real elapsed time:
//! - a backward step grants no token, and one second of real time later about 10 tokens have refilled
//!   (no freeze: the old behaviour refilled nothing until the clock caught up, an hour later);
//! - a forward step can at most fill the bucket (the table store, on the wall clock, does; the memory store,
//!   on a clock that never steps, does not notice).

use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use rate_limit_integration::{env, most_refilled, stores, TestDb};

const QUICK_CALLS: usize = 30;

struct Server {
    file: String,
}

impl Server {
    /// Steps the server's wall clock to `offset` from real time (libfaketime syntax: `+0`, `+1h`, `-1h`).
    fn set_clock(&self, offset: &str) {
        std::fs::write(&self.file, format!("{offset}\n")).expect("write the faketime file");
    }
}

/// One way of asking for a token: `rate_limiting_request` or `take` of a policy, in a store.
#[derive(Clone, Copy, Debug)]
enum Call {
    Request,
    Policy,
}

fn ask(client: &mut Client, call: Call, store: &str, key: &str) -> bool {
    let sql = match call {
        Call::Request => "SELECT rate_limiting_request($1, 10, 1) >= 0",
        Call::Policy => "SELECT allowed FROM rate_limit.take('ten_' || $2, $1)",
    };
    let params: Vec<&(dyn postgres::types::ToSql + Sync)> = match call {
        Call::Request => vec![&key],
        Call::Policy => vec![&key, &store],
    };
    client.query_one(sql, &params).expect(sql).get(0)
}

/// What one run of `QUICK_CALLS` calls made as fast as possible was granted, and when (client instants).
struct Burst {
    granted: usize,
    /// Just before the first call was sent: no call of this burst reached the server earlier.
    first_sent: Instant,
    /// Just before the last call was sent.
    last_sent: Instant,
    /// When the last answer came back: every call of this burst reached the server before.
    ended: Instant,
}

/// The most whole tokens the 10-per-second buckets refill in `span`.
fn refill_in(span: Duration) -> usize {
    most_refilled(10.0, span) as usize
}

impl Burst {
    /// At most a full bucket (10) plus what refilled while the burst ran.
    fn most_from_full(&self) -> usize {
        10 + refill_in(self.ended - self.first_sent)
    }

    /// At most what refilled since `before` left the bucket drained, plus its fraction of a token.
    fn most_after_draining(&self, before: &Burst) -> usize {
        1 + refill_in(self.ended - before.last_sent)
    }
}

/// Grants among `QUICK_CALLS` calls made as fast as possible.
fn grants(client: &mut Client, call: Call, store: &str, key: &str) -> Burst {
    let first_sent = Instant::now();
    let mut last_sent = first_sent;
    let mut granted = 0;
    for _ in 0..QUICK_CALLS {
        last_sent = Instant::now();
        granted += usize::from(ask(client, call, store, key));
    }
    Burst {
        granted,
        first_sent,
        last_sent,
        ended: Instant::now(),
    }
}

/// After a backward step: no token minted at once, about 10 after one second of real time. `drained` is the
/// burst that emptied the bucket before the step.
fn step_back_then_refill(
    client: &mut Client,
    call: Call,
    store: &str,
    key: &str,
    what: &str,
    drained: &Burst,
) {
    let at_once = grants(client, call, store, key);
    assert!(
        at_once.granted <= at_once.most_after_draining(drained),
        "{what}: a backward step mints nothing ({} granted, at most {} refilled in real time)",
        at_once.granted,
        at_once.most_after_draining(drained)
    );
    thread::sleep(Duration::from_millis(1000));
    let refilled = grants(client, call, store, key);
    assert!(
        (8..=refilled.most_from_full()).contains(&refilled.granted),
        "{what}: refill resumes from the step at 10/s ({} in ~1 s, at most {})",
        refilled.granted,
        refilled.most_from_full()
    );
}

/// After a forward step: at most a full bucket (the table store, on the wall clock, fills it).
fn step_forward(client: &mut Client, call: Call, store: &str, key: &str, what: &str) -> Burst {
    let burst = grants(client, call, store, key);
    assert!(
        burst.granted <= burst.most_from_full(),
        "{what}: a forward step fills at most ({} granted, at most {})",
        burst.granted,
        burst.most_from_full()
    );
    if store == "table" {
        assert!(
            burst.granted >= 10,
            "{what}: the wall clock moved an hour ({})",
            burst.granted
        );
    }
    burst
}

/// Drains a new bucket at real time, steps the clock to `first` and back, checking each step.
fn steps(server: &Server, client: &mut Client, call: Call, store: &str, first: &str) {
    let key = format!("{call:?}_{store}_{first}");
    let what = format!("{call:?} in the {store} store, stepping {first} first");
    server.set_clock("+0");
    let new = grants(client, call, store, &key);
    assert!(
        (10..=new.most_from_full()).contains(&new.granted),
        "{what}: a new bucket grants its 10 tokens and what refilled meanwhile ({} granted, at most {})",
        new.granted,
        new.most_from_full()
    );
    server.set_clock(first);
    if first.starts_with('+') {
        let forward = step_forward(client, call, store, &key, &what);
        server.set_clock("+0");
        step_back_then_refill(client, call, store, &key, &what, &forward);
    } else {
        step_back_then_refill(client, call, store, &key, &what, &new);
        server.set_clock("+0");
        step_forward(client, call, store, &key, &what);
    }
}

#[test]
fn clock_steps_neither_mint_nor_freeze() {
    let server = Server {
        file: env("RATE_LIMIT_TEST_FAKETIME_FILE"),
    };
    server.set_clock("+0");
    let db = TestDb::on(&env("RATE_LIMIT_TEST_FAKETIME_CONNINFO"), "clock_steps");
    let mut client = db.connect();
    client
        .batch_execute(
            "SELECT rate_limit.create_policy('ten_table', 10, '1 second', 10, store => 'table');
             SELECT rate_limit.create_policy('ten_memory', 10, '1 second', 10, store => 'memory');",
        )
        .expect("policies");
    for store in stores() {
        client
            .batch_execute(&format!("SET rate_limit.store = '{store}'"))
            .expect("store");
        for call in [Call::Request, Call::Policy] {
            for first in ["+1h", "-1h"] {
                steps(&server, &mut client, call, store, first);
            }
        }
    }
    server.set_clock("+0");
}
