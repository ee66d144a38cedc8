//! Reservations against a real server, in every store of the edition under test:
//! - from 16 connections at once reserving and settling at random (settles below, at and above the
//!   estimate, a second settle of the same id, a settle rolled back and made again, a settle of an id
//!   nobody was given, reservations left unsettled), every token is accounted for: the key's bucket lost
//!   exactly the estimates of the unsettled reservations plus the actual use of the settled ones
//!   (granted = reserved − refunded + excess charged), and each settle answered true exactly once;
//! - a settle rolled back (ROLLBACK, ROLLBACK TO SAVEPOINT) is not applied, in the memory store too, whose
//!   settles wait for the commit; PREPARE TRANSACTION of a memory-store settle is refused with 0A000;
//! - a role with only LOGIN can settle its own reservation once, never into more tokens than it reserved,
//!   and nothing with ids it was not given;
//! - a reservation not settled within its hold is settled at its estimate, and its bucket is purged.

use std::thread;
use std::time::Duration;

use postgres::Client;
use rate_limit_integration::{compiled_only, stores, TestDb};

const THREADS: u64 = 16;
const ROUNDS: u64 = 40;
const BURST: i64 = 20_000;

/// The key's bucket's tokens now (negative in debt), its reservations' buckets left out.
fn tokens(c: &mut Client, key: &str) -> f64 {
    c.query_one(
        "SELECT coalesce(sum(tokens)::float8, $2) FROM rate_limit.buckets \
         WHERE policy = 'llm' AND key = $1 AND algorithm <> 'reservation'",
        &[&key, &(BURST as f64)],
    )
    .expect("buckets")
    .get(0)
}

/// Asserts the key's bucket holds `expected` tokens, within what refills while a test runs (1 token a
/// day: far below 0.01).
fn assert_tokens(c: &mut Client, key: &str, expected: f64, what: &str) {
    let now = tokens(c, key);
    assert!(
        now >= expected && now < expected + 0.01,
        "{what}: {now} tokens, expected {expected}"
    );
}

/// A database with policy `llm`: 1 token a day (nothing refills while a test runs), burst 20 000,
/// max_debt 100 000 (beyond any debt a test runs into), in `store`.
fn llm_policy(name: &str, store: &str) -> TestDb {
    let db = TestDb::new(&format!("reservations_{name}_{store}"));
    let mut admin = db.connect();
    admin
        .batch_execute("SET rate_limit.max_policy_refill_time = '200000d'")
        .expect("raise the bound");
    admin
        .execute(
            "SELECT rate_limit.create_policy('llm', 1, '1 day', burst => $1, max_debt => 100000, store => $2)",
            &[&BURST, &store],
        )
        .expect("create policy");
    db
}

/// A settle's `allowed` (this call settled the reservation).
fn settle(c: &mut Client, key: &str, id: i64, actual: i64) -> bool {
    c.query_one(
        "SELECT allowed FROM rate_limit.settle('llm', $1, $2, $3)",
        &[&key, &id, &actual],
    )
    .expect("settle")
    .get(0)
}

/// A reserve: its id when granted.
fn reserve(c: &mut Client, key: &str, estimate: i64, hold: &str) -> Option<i64> {
    let row = c
        .query_one(
            "SELECT allowed, lease FROM rate_limit.reserve('llm', $1, $2, $3::text::interval)",
            &[&key, &estimate, &hold],
        )
        .expect("reserve");
    let (allowed, id): (bool, Option<i64>) = (row.get(0), row.get(1));
    assert_eq!(allowed, id.is_some(), "an id exactly when granted");
    id
}

/// A small deterministic generator (xorshift64*), one per connection.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> i64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        i64::try_from(self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n).unwrap_or(0)
    }
}

/// One connection's rounds: what its calls consumed of the key's bucket, by the reference's count.
fn one_connection(mut c: Client, seed: u64) -> i64 {
    let mut dice = Dice(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) + 1);
    let mut consumed = 0;
    for _ in 0..ROUNDS {
        let estimate = 1 + dice.below(50);
        let Some(id) = reserve(&mut c, "k", estimate, "1 hour") else {
            continue;
        };
        let actual = dice.below(100);
        match dice.below(5) {
            // left unsettled: the estimate stays taken
            0 => consumed += estimate,
            // settled, then settled again: the second changes nothing
            1 => {
                assert!(settle(&mut c, "k", id, actual), "the first settle settles");
                assert!(
                    !settle(&mut c, "k", id, 0),
                    "a second settle settles nothing"
                );
                consumed += actual;
            }
            // settled in a transaction that rolls back, then for real
            2 => {
                c.batch_execute("BEGIN").expect("begin");
                assert!(settle(&mut c, "k", id, 0));
                c.batch_execute("ROLLBACK").expect("rollback");
                assert!(
                    settle(&mut c, "k", id, actual),
                    "a rolled-back settle left it held"
                );
                consumed += actual;
            }
            // an id nobody was given settles nothing, the real one at its estimate
            3 => {
                assert!(!settle(&mut c, "k", -id, 0));
                assert!(settle(&mut c, "k", id, estimate));
                consumed += estimate;
            }
            // settled under a savepoint rolled back inside a committed transaction, then for real
            _ => {
                c.batch_execute("BEGIN; SAVEPOINT s").expect("savepoint");
                assert!(settle(&mut c, "k", id, 0));
                c.batch_execute("ROLLBACK TO SAVEPOINT s; COMMIT")
                    .expect("rollback to savepoint");
                assert!(settle(&mut c, "k", id, actual));
                consumed += actual;
            }
        }
    }
    consumed
}

fn reservations_are_exact_under_16_connections(store: &str) {
    let db = llm_policy("exact", store);
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let c = db.connect();
            thread::spawn(move || one_connection(c, i))
        })
        .collect();
    let consumed: i64 = handles.into_iter().map(|h| h.join().expect("client")).sum();
    let expected = (BURST - consumed) as f64;
    let now = tokens(&mut db.connect(), "k");
    assert!(
        now >= expected && now < expected + 0.01,
        "{store}: {now} tokens, expected {expected} ({consumed} consumed)"
    );
}

#[test]
fn reservations_are_exact_under_16_connections_in_every_store() {
    for store in stores() {
        reservations_are_exact_under_16_connections(store);
    }
}

#[test]
fn a_plain_role_settles_its_own_reservation_once_and_no_other() {
    for store in stores() {
        let db = llm_policy("plain_role", store);
        let mut c = db.connect_as_login_role("rl_settler");
        // the buckets are the owner's to read
        let mut owner = db.connect();
        let other = reserve(&mut c, "someone else", 10, "1 hour").expect("granted");
        let before = tokens(&mut owner, "mine");
        let id = reserve(&mut c, "mine", 40, "1 hour").expect("granted");
        assert_tokens(&mut owner, "mine", before - 40.0, store);
        assert!(settle(&mut c, "mine", id, 0), "{store}");
        assert_tokens(
            &mut owner,
            "mine",
            before,
            &format!("{store}: the whole reservation back"),
        );
        assert!(!settle(&mut c, "mine", id, 0), "{store}: once");
        // ids it was not given: another key's, and made-up ones
        assert!(!settle(&mut c, "mine", other, 0), "{store}");
        let mut dice = Dice(7);
        for _ in 0..200 {
            let made_up = dice.below(u64::MAX >> 1);
            assert!(!settle(&mut c, "mine", made_up, 0), "{store}");
        }
        assert_tokens(
            &mut owner,
            "mine",
            before,
            &format!("{store}: never more than reserved"),
        );
        assert_tokens(&mut owner, "someone else", (BURST - 10) as f64, store);
    }
}

#[test]
fn an_unsettled_reservation_expires_at_its_estimate_and_is_purged() {
    for store in stores() {
        let db = llm_policy("expiry", store);
        let mut c = db.connect();
        let id = reserve(&mut c, "k", 25, "200 ms").expect("granted");
        thread::sleep(Duration::from_millis(400));
        assert!(!settle(&mut c, "k", id, 0), "{store}: expired");
        assert_tokens(&mut c, "k", (BURST - 25) as f64, store);
        c.execute("SELECT rate_limit.purge()", &[]).expect("purge");
        let left: i64 = c
            .query_one(
                "SELECT count(*) FROM rate_limit.buckets WHERE algorithm = 'reservation'",
                &[],
            )
            .expect("count")
            .get(0);
        assert_eq!(
            left, 0,
            "{store}: the expired reservation's bucket is full, so purged"
        );
    }
}

#[test]
fn a_memory_store_settle_cannot_be_prepared() {
    if compiled_only("the memory store") {
        return;
    }
    let db = llm_policy("prepare", "memory");
    let mut c = db.connect();
    let id = reserve(&mut c, "k", 5, "1 hour").expect("granted");
    c.batch_execute("BEGIN").expect("begin");
    assert!(settle(&mut c, "k", id, 0));
    let e = c
        .batch_execute("PREPARE TRANSACTION 'rl_settle'")
        .expect_err("refused");
    assert_eq!(e.code().map(|s| s.code()), Some("0A000"), "{e:?}");
    // the failed PREPARE rolled the transaction back: nothing was settled
    assert_tokens(&mut c, "k", (BURST - 5) as f64, "prepared");
    assert!(settle(&mut c, "k", id, 0));
    assert_tokens(&mut c, "k", BURST as f64, "settled after");
}
