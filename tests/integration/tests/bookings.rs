//! Booked slots against a real server, in every store of the edition under test:
//! - 16 connections booking one key at once (4 bookings each) get times that strictly increase, one slot
//!   of the rate apart, none shared: each booking's record (its bucket beside the key's) is held until
//!   exactly the time its caller was told to come back, and the times follow one another at the rate;
//! - a booking rolled back is undone (table store), a cancel of the last booking gives its slot to the
//!   next one, a cancel of one in the middle frees nothing to anybody, a second cancel and one after the
//!   booking's time change nothing;
//! - a role with only LOGIN books and cancels its own booking, and cancels nothing with ids it was not
//!   given.

use std::sync::{Arc, Barrier};
use std::thread;

use postgres::Client;
use rate_limit_integration::{stores, TestDb};

const THREADS: usize = 16;
const EACH: usize = 4;
/// µs between two slots: the policy refills 2 tokens a second.
const SLOT_US: i64 = 500_000;

/// A database with policy `calls`: 2 tokens a second, burst 1, up to 1 000 tokens booked ahead, in
/// `store`.
fn calls_policy(name: &str, store: &str) -> TestDb {
    let db = TestDb::new(&format!("bookings_{name}_{store}"));
    db.connect()
        .execute(
            "SELECT rate_limit.create_policy('calls', 2, '1 second', burst => 1, max_debt => 1000, \
             store => $1)",
            &[&store],
        )
        .expect("create policy");
    db
}

/// A booking: allowed, its wait in µs (NULL when denied) and its id.
fn book(c: &mut Client, key: &str, cost: i64) -> (bool, Option<i64>, Option<i64>) {
    let row = c
        .query_one(
            "SELECT allowed, (extract(epoch FROM retry_after) * 1000000)::int8, lease \
             FROM rate_limit.book('calls', $1, $2)",
            &[&key, &cost],
        )
        .expect("book");
    (row.get(0), row.get(1), row.get(2))
}

/// A cancel's `allowed` (this call cancelled the booking).
fn cancel(c: &mut Client, key: &str, id: i64) -> bool {
    c.query_one(
        "SELECT allowed FROM rate_limit.cancel_booking('calls', $1, $2)",
        &[&key, &id],
    )
    .expect("cancel")
    .get(0)
}

/// The key's queue: how many µs from now until the bucket is out of debt, from its tokens (negative).
fn queue_us(c: &mut Client, key: &str) -> i64 {
    let tokens: f64 = c
        .query_one(
            "SELECT coalesce(sum(tokens)::float8, 1) FROM rate_limit.buckets \
             WHERE policy = 'calls' AND key = $1 AND algorithm = 'token_bucket'",
            &[&key],
        )
        .expect("buckets")
        .get(0);
    (-tokens * SLOT_US as f64).round() as i64
}

fn sixteen_connections_get_the_rates_slots(store: &str) {
    let db = calls_policy("slots", store);
    let mut admin = db.connect();
    // the burst taken: every booking below is for later
    assert!(book(&mut admin, "k", 1).0);
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut c = db.connect();
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                (0..EACH).map(|_| book(&mut c, "k", 1)).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut waits: Vec<i64> = Vec::new();
    let mut ids: Vec<i64> = Vec::new();
    for h in handles {
        for (allowed, wait, id) in h.join().expect("client") {
            assert!(
                allowed,
                "{store}: a booking within the queue's depth is granted"
            );
            let (Some(wait), Some(id)) = (wait, id) else {
                panic!("{store}: a booking for later has a wait and an id");
            };
            assert!(
                wait > 0,
                "{store}: the burst was taken: every booking waits"
            );
            waits.push(wait);
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), THREADS * EACH, "{store}: one id per booking");
    // each booking's record: held from its booking's instant for exactly the wait its caller was told
    let rows = admin
        .query(
            "SELECT (extract(epoch FROM per) * 1000000)::int8, \
                    ((updated_at + per) - timestamptz '2000-01-01 00:00:00+00') AS until \
             FROM rate_limit.buckets WHERE policy = 'calls' AND key = 'k' AND algorithm = 'reservation'",
            &[],
        )
        .expect("bookings' records");
    let mut held: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    held.sort_unstable();
    waits.sort_unstable();
    assert_eq!(
        held, waits,
        "{store}: every record held for its caller's wait"
    );
    // the times themselves: one slot apart, strictly increasing, none shared. Exact to the microsecond
    // in the table store; the memory store keeps its instants on a clock that never steps and its view
    // converts each to wall time when read, which may round a microsecond either way
    let tolerance: i64 = if store == "memory" { 2 } else { 0 };
    let gaps: Vec<i64> = admin
        .query(
            "SELECT (extract(epoch FROM (updated_at + per) - lag(updated_at + per) \
                     OVER (ORDER BY updated_at + per)) * 1000000)::int8 \
             FROM rate_limit.buckets WHERE policy = 'calls' AND key = 'k' AND algorithm = 'reservation' \
             ORDER BY updated_at + per OFFSET 1",
            &[],
        )
        .expect("times")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(gaps.len(), THREADS * EACH - 1);
    let off: Vec<&i64> = gaps
        .iter()
        .filter(|&&g| (g - SLOT_US).abs() > tolerance)
        .collect();
    assert!(
        off.is_empty(),
        "{store}: gaps other than a half second: {off:?}"
    );
    // and the key's queue ends with the last of them
    let queue = queue_us(&mut admin, "k");
    assert!(
        (queue - waits[waits.len() - 1]).abs() < 200_000,
        "{store}: the queue ends {queue} µs from now, the last booking {} µs after its call",
        waits[waits.len() - 1]
    );
}

#[test]
fn sixteen_connections_booking_one_key_get_the_rates_slots_in_every_store() {
    for store in stores() {
        sixteen_connections_get_the_rates_slots(store);
    }
}

#[test]
fn a_cancel_gives_the_last_slot_back_once_and_a_middle_one_to_nobody() {
    for store in stores() {
        let db = calls_policy("cancel", store);
        let mut c = db.connect();
        assert!(book(&mut c, "k", 1).0, "{store}: the burst");
        let ids: Vec<i64> = (0..4)
            .map(|_| book(&mut c, "k", 1).2.expect("an id"))
            .collect();
        let before = queue_us(&mut c, "k");
        // the last: its slot goes back, once
        assert!(cancel(&mut c, "k", ids[3]), "{store}");
        assert!(!cancel(&mut c, "k", ids[3]), "{store}: a second cancel");
        let after = queue_us(&mut c, "k");
        assert!(
            (before - after - SLOT_US).abs() < 100_000,
            "{store}: the queue shortened by one slot ({before} -> {after})"
        );
        // one in the middle: cancelled, but the queue stays as long (later bookings wait behind it)
        assert!(cancel(&mut c, "k", ids[1]), "{store}");
        let middle = queue_us(&mut c, "k");
        assert!(
            (after - middle).abs() < 100_000,
            "{store}: nothing given back ({after} -> {middle})"
        );
        // ids nobody was given, another key's, and a booking whose time has come
        assert!(!cancel(&mut c, "k", 42), "{store}");
        assert!(!cancel(&mut c, "other", ids[2]), "{store}");
        c.batch_execute("SELECT pg_sleep(0.6)").expect("sleep");
        assert!(!cancel(&mut c, "k", ids[0]), "{store}: its time has come");
    }
}

#[test]
fn a_booking_rolled_back_is_undone_in_the_table_store() {
    let db = calls_policy("rollback", "table");
    let mut c = db.connect();
    assert!(book(&mut c, "k", 1).0);
    c.batch_execute("BEGIN").expect("begin");
    let (_, _, id) = book(&mut c, "k", 10);
    assert!(id.is_some());
    c.batch_execute("ROLLBACK").expect("rollback");
    let (allowed, wait, _) = book(&mut c, "k", 1);
    assert!(allowed);
    assert!(
        wait.is_some_and(|w| w <= SLOT_US),
        "the rolled-back booking's ten slots are free again: {wait:?}"
    );
    // and a cancel rolled back leaves the booking to be cancelled again
    let (_, _, id) = book(&mut c, "k", 1);
    let id = id.expect("an id");
    c.batch_execute("BEGIN").expect("begin");
    assert!(cancel(&mut c, "k", id));
    c.batch_execute("ROLLBACK").expect("rollback");
    assert!(cancel(&mut c, "k", id), "the cancel was rolled back");
}

#[test]
fn a_plain_role_books_and_cancels_its_own_and_nothing_else() {
    for store in stores() {
        let db = calls_policy("plain", store);
        let mut owner = db.connect();
        assert!(book(&mut owner, "k", 1).0);
        let (_, _, others) = book(&mut owner, "k", 1);
        let others = others.expect("an id");
        let mut plain = db.connect_as_login_role("rl_booker");
        let (allowed, wait, id) = book(&mut plain, "k", 1);
        assert!(allowed && wait.is_some_and(|w| w > SLOT_US / 2), "{store}");
        let id = id.expect("an id");
        assert!(cancel(&mut plain, "k", id), "{store}: its own");
        assert!(!cancel(&mut plain, "k", id), "{store}: once");
        for guess in [1, 2, 3, others + 1, others - 1] {
            assert!(!cancel(&mut plain, "k", guess), "{store}: {guess}");
        }
        // the owner's booking stands
        assert!(cancel(&mut owner, "k", others), "{store}");
    }
}
