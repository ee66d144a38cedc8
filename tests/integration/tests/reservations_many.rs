//! Reservations over several limits (`reserve_many`, `settle_many`) against a real server, in every store
//! of the edition under test, with a requests-per-period policy `rpm` (meters: one token per request) and
//! a tokens-per-period policy `tpm` (meters: 0.5 per input token, 1 per output token):
//! - exact values: each policy takes its own estimate, all or nothing (a call one policy denies takes
//!   nothing from the other, and names the policy that denied it), one id settles each policy once, on
//!   what that policy counts, whether given in tokens or as amounts each policy weighs with its meters;
//!   a settle of one policy alone (`settle`) and a settle rolled back are accounted for;
//! - from 16 connections at once reserving and settling random amounts, every token of both policies is
//!   accounted for, against the test's own weighing;
//! - every misuse gets its SQLSTATE, and a role with only LOGIN settles its own reservation once and
//!   nothing with an id it was not given.

use std::thread;

use postgres::Client;
use rate_limit_integration::{stores, TestDb};

const THREADS: u64 = 16;
const ROUNDS: u64 = 20;
const BURST: i64 = 100_000;

/// What `input` and `output` tokens cost under `tpm` (0.5 and 1 a token), rounded up.
fn tpm_cost(input: i64, output: i64) -> i64 {
    (input + 1) / 2 + output
}

/// The amounts of one request of `input` and `output` tokens, as JSON.
fn amounts(input: i64, output: i64) -> String {
    format!("{{\"requests\": 1, \"input\": {input}, \"output\": {output}}}")
}

/// A database with policies `rpm` and `tpm`, each 100 000 tokens per 1000 days (less than a token refills
/// while a test runs), burst 100 000, max_debt 100 000, in `store`.
fn policies(name: &str, store: &str) -> TestDb {
    let db = TestDb::new(&format!("many_{name}_{store}"));
    let mut admin = db.connect();
    admin
        .batch_execute("SET rate_limit.max_policy_refill_time = '200000d'")
        .expect("raise the bound");
    for (policy, meters) in [
        ("rpm", r#"{"requests": 1, "input": 0, "output": 0}"#),
        ("tpm", r#"{"requests": 0, "input": 0.5, "output": 1}"#),
    ] {
        admin
            .execute(
                "SELECT rate_limit.create_policy($1, $2, '1000 days', max_debt => 100000, store => $3, \
                 options => jsonb_build_object('meters', $4::text::jsonb))",
                &[&policy, &BURST, &store, &meters],
            )
            .expect("create policy");
    }
    db
}

/// The tokens the key's bucket under `policy` lost (whole: nothing refills), its reservations left out.
fn used(c: &mut Client, policy: &str, key: &str) -> i64 {
    let left: i64 = c
        .query_one(
            "SELECT coalesce(floor(sum(tokens))::bigint, $3) FROM rate_limit.buckets \
             WHERE policy = $1 AND key = $2 AND algorithm <> 'reservation'",
            &[&policy, &key, &BURST],
        )
        .expect("buckets")
        .get(0);
    BURST - left
}

/// What `rpm` and `tpm` lost for `key`.
fn both_used(c: &mut Client, key: &str) -> (i64, i64) {
    (used(c, "rpm", key), used(c, "tpm", key))
}

/// A reserve_many in tokens: whether granted, the deciding policy, and the id.
fn reserve(c: &mut Client, key: &str, estimates: &[i64]) -> (bool, String, Option<i64>) {
    let row = c
        .query_one(
            "SELECT allowed, policy, lease FROM rate_limit.reserve_many(ARRAY['rpm', 'tpm'], $1, $2)",
            &[&key, &estimates],
        )
        .expect("reserve_many");
    (row.get(0), row.get(1), row.get(2))
}

/// A reserve_many by amounts: the id when granted.
fn reserve_amounts(c: &mut Client, key: &str, input: i64, output: i64) -> Option<i64> {
    c.query_one(
        "SELECT lease FROM rate_limit.reserve_many(ARRAY['rpm', 'tpm'], $1, \
         amounts => $2::text::jsonb)",
        &[&key, &amounts(input, output)],
    )
    .expect("reserve_many by amounts")
    .get(0)
}

/// A settle_many in tokens: whether this call settled the reservation.
fn settle(c: &mut Client, key: &str, id: i64, actuals: &[i64]) -> bool {
    c.query_one(
        "SELECT allowed FROM rate_limit.settle_many(ARRAY['rpm', 'tpm'], $1, $2, $3)",
        &[&key, &id, &actuals],
    )
    .expect("settle_many")
    .get(0)
}

/// A settle_many by amounts: whether this call settled the reservation.
fn settle_amounts(c: &mut Client, key: &str, id: i64, input: i64, output: i64) -> bool {
    c.query_one(
        "SELECT allowed FROM rate_limit.settle_many(ARRAY['rpm', 'tpm'], $1, $2, \
         amounts => $3::text::jsonb)",
        &[&key, &id, &amounts(input, output)],
    )
    .expect("settle_many by amounts")
    .get(0)
}

fn exact_values(store: &str) {
    let db = policies("exact", store);
    let mut c = db.connect();
    let (allowed, _, id) = reserve(&mut c, "k", &[1, 60]);
    let id = id.expect("an id");
    assert!(allowed, "{store}");
    assert_eq!(
        both_used(&mut c, "k"),
        (1, 60),
        "{store}: each its estimate"
    );
    assert!(settle(&mut c, "k", id, &[1, 25]), "{store}");
    assert_eq!(both_used(&mut c, "k"), (1, 25), "{store}: 35 tokens back");
    assert!(!settle(&mut c, "k", id, &[0, 0]), "{store}: settled once");
    assert_eq!(both_used(&mut c, "k"), (1, 25), "{store}");
    // tpm holds 99 975: a reservation of 99 976 is denied by tpm, and takes nothing from rpm either
    let (allowed, policy, id) = reserve(&mut c, "k", &[1, BURST - 24]);
    assert!(!allowed && id.is_none(), "{store}");
    assert_eq!(policy, "tpm", "{store}: the policy that decided");
    assert_eq!(both_used(&mut c, "k"), (1, 25), "{store}: nothing taken");
    // one estimate for every policy
    let (_, _, id) = reserve(&mut c, "k", &[5]);
    assert_eq!(both_used(&mut c, "k"), (6, 30), "{store}");
    assert!(settle(&mut c, "k", id.expect("an id"), &[0]));
    assert_eq!(both_used(&mut c, "k"), (1, 25), "{store}: all back");
    // amounts, each policy weighing them with its own meters: 1 request; 100 × 0.5 + 50 = 100 tokens
    let id = reserve_amounts(&mut c, "a", 100, 50).expect("an id");
    assert_eq!(both_used(&mut c, "a"), (1, 100), "{store}");
    // used: 1 request; 11 × 0.5 + 5 = 10.5, rounded up to 11
    assert!(settle_amounts(&mut c, "a", id, 11, 5));
    assert_eq!(both_used(&mut c, "a"), (1, 11), "{store}");
    // beyond the estimate: the excess charged
    let id = reserve_amounts(&mut c, "a", 0, 10).expect("an id");
    assert!(settle_amounts(&mut c, "a", id, 0, 40));
    assert_eq!(both_used(&mut c, "a"), (2, 51), "{store}");
    // one policy settled alone first: settle_many settles the other, once
    let (_, _, id) = reserve(&mut c, "s", &[1, 50]);
    let id = id.expect("an id");
    let alone: bool = c
        .query_one(
            "SELECT allowed FROM rate_limit.settle('tpm', 's', $1, 20)",
            &[&id],
        )
        .expect("settle one policy")
        .get(0);
    assert!(alone, "{store}");
    assert!(settle(&mut c, "s", id, &[1, 0]), "{store}: rpm's part");
    assert!(!settle(&mut c, "s", id, &[0, 0]), "{store}");
    assert_eq!(both_used(&mut c, "s"), (1, 20), "{store}");
    // a settle rolled back did not happen: it can be made again
    let (_, _, id) = reserve(&mut c, "r", &[1, 50]);
    let id = id.expect("an id");
    c.batch_execute("BEGIN").expect("begin");
    assert!(settle(&mut c, "r", id, &[0, 0]));
    c.batch_execute("ROLLBACK").expect("rollback");
    assert_eq!(both_used(&mut c, "r"), (1, 50), "{store}: not applied");
    assert!(settle(&mut c, "r", id, &[1, 10]), "{store}: settled now");
    assert_eq!(both_used(&mut c, "r"), (1, 10), "{store}");
}

#[test]
fn each_policy_takes_its_own_estimate_all_or_nothing_and_settles_once() {
    for store in stores() {
        exact_values(store);
    }
}

/// One connection's rounds: reserve random amounts over both policies, then settle random amounts (some
/// left unsettled, some settled twice); what each policy lost by the test's own weighing.
fn one_connection(mut c: Client, seed: u64) -> (i64, i64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut below = |n: u64| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        i64::try_from(x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n).unwrap_or(0)
    };
    let (mut requests, mut tokens) = (0, 0);
    for _ in 0..ROUNDS {
        let (input, output) = (below(250), 1 + below(150));
        let id = reserve_amounts(&mut c, "shared", input, output)
            .expect("the bursts cover every reservation");
        requests += 1;
        match below(6) {
            0 => tokens += tpm_cost(input, output), // left unsettled: its estimates stay taken
            n => {
                let (input, output) = (below(250), below(200));
                assert!(settle_amounts(&mut c, "shared", id, input, output));
                tokens += tpm_cost(input, output);
                if n == 1 {
                    assert!(!settle_amounts(&mut c, "shared", id, 0, 0), "once");
                }
            }
        }
    }
    (requests, tokens)
}

fn sixteen_connections(store: &str) {
    let db = policies("hammer", store);
    let handles: Vec<_> = (0..THREADS)
        .map(|seed| {
            let c = db.connect();
            thread::spawn(move || one_connection(c, seed))
        })
        .collect();
    let (requests, tokens) = handles
        .into_iter()
        .map(|h| h.join().expect("a connection"))
        .fold((0, 0), |(r, t), (r1, t1)| (r + r1, t + t1));
    assert_eq!(requests, (THREADS * ROUNDS) as i64);
    assert_eq!(
        both_used(&mut db.connect(), "shared"),
        (requests, tokens),
        "{store}: every request and every weighed token accounted for"
    );
}

#[test]
fn reservations_over_two_policies_are_exact_under_16_connections() {
    for store in stores() {
        sixteen_connections(store);
    }
}

fn misuse(store: &str) {
    let db = policies("misuse", store);
    let mut c = db.connect();
    let (_, _, id) = reserve(&mut c, "k", &[1, 5]);
    let id = id.expect("an id");
    let state = |c: &mut Client, sql: &str| -> String {
        c.query(sql, &[])
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| e.code().map_or("none".into(), |s| s.code().to_string()))
    };
    let r = "SELECT rate_limit.reserve_many";
    let cases = [
        (format!("{r}(NULL, 'k', ARRAY[1])"), "22004"),
        (format!("{r}('{{}}', 'k', ARRAY[1])"), "22023"),
        (
            format!("{r}(array_fill('rpm'::text, ARRAY[17]), 'k', ARRAY[1])"),
            "22023",
        ),
        (format!("{r}(ARRAY['rpm', 'nope'], 'k', ARRAY[1])"), "42704"),
        (format!("{r}(ARRAY['rpm', NULL], 'k', ARRAY[1])"), "22004"),
        (format!("{r}(ARRAY['rpm', 'tpm'], NULL, ARRAY[1])"), "22004"),
        (format!("{r}(ARRAY['rpm', 'tpm'], 'k')"), "22004"),
        (
            format!("{r}(ARRAY['rpm', 'tpm'], 'k', ARRAY[1], amounts => '{{\"requests\": 1}}')"),
            "22023",
        ),
        (
            format!("{r}(ARRAY['rpm', 'tpm'], 'k', ARRAY[1, 2, 3])"),
            "22023",
        ),
        (
            format!("{r}(ARRAY['rpm', 'tpm'], 'k', ARRAY[1, NULL])"),
            "22004",
        ),
        (
            format!("{r}(ARRAY['rpm', 'tpm'], 'k', ARRAY[1, 0])"),
            "22023",
        ),
        (format!("{r}(ARRAY['rpm', 'rpm'], 'k', ARRAY[1])"), "22023"),
        (
            format!("{r}(ARRAY['rpm', 'tpm'], 'k', ARRAY[1], NULL)"),
            "22004",
        ),
        // rpm weighs this to 0 tokens: an estimate must be 1 or more under every policy
        (
            format!("{r}(ARRAY['rpm', 'tpm'], 'k', amounts => '{{\"input\": 5}}')"),
            "22023",
        ),
        (
            format!(
                "{r}(ARRAY['rpm', 'tpm'], 'k', amounts => '{{\"requests\": 1, \"cached\": 5}}')"
            ),
            "22023",
        ),
        (
            "SELECT rate_limit.settle_many(ARRAY['rpm', 'tpm'], 'k', NULL, ARRAY[0])".to_string(),
            "22004",
        ),
        (
            format!("SELECT rate_limit.settle_many(ARRAY['rpm', 'tpm'], 'k', {id})"),
            "22004",
        ),
        (
            format!("SELECT rate_limit.settle_many(ARRAY['rpm', 'tpm'], 'k', {id}, ARRAY[-1])"),
            "22023",
        ),
        (
            format!(
                "SELECT rate_limit.settle_many(ARRAY['rpm', 'tpm'], 'k', {id}, ARRAY[0, 0, 0])"
            ),
            "22023",
        ),
    ];
    for (sql, expected) in &cases {
        assert_eq!(&state(&mut c, sql), expected, "{store}: {sql}");
    }
    // a concurrency policy holds leases, not tokens: it cannot be reserved from (as with reserve)
    c.batch_execute(&format!(
        "SELECT rate_limit.create_policy('slots', 4, '1 minute', algorithm => 'concurrency', \
         store => '{store}')"
    ))
    .expect("a concurrency policy");
    assert_eq!(
        state(
            &mut c,
            &format!("{r}(ARRAY['rpm', 'slots'], 'k', ARRAY[1])")
        ),
        "42809",
        "{store}"
    );
    if stores().len() > 1 {
        // all or nothing holds within one store only
        c.batch_execute(&format!(
            "SELECT rate_limit.create_policy('elsewhere', 10, '1 minute', store => '{}')",
            if store == "table" { "memory" } else { "table" }
        ))
        .expect("a policy in the other store");
        assert_eq!(
            state(
                &mut c,
                &format!("{r}(ARRAY['rpm', 'elsewhere'], 'k', ARRAY[1])")
            ),
            "0A000",
            "{store}"
        );
    }
    // nothing of it changed a bucket
    assert_eq!(both_used(&mut c, "k"), (1, 5), "{store}");
    assert!(settle(&mut c, "k", id, &[0]));
    // a role with only LOGIN reserves and settles its own reservation once; an id it was not given
    // settles nothing
    let mut role = db.connect_as_login_role("rl_many");
    let (_, _, mine) = reserve(&mut role, "r", &[1, 30]);
    let mine = mine.expect("an id");
    for made_up in [1, 2, id, mine ^ 1, i64::MAX] {
        assert!(!settle(&mut role, "r", made_up, &[0]), "{store}: {made_up}");
    }
    assert!(settle(&mut role, "r", mine, &[1, 10]));
    assert!(!settle(&mut role, "r", mine, &[0]), "{store}: once");
    assert_eq!(both_used(&mut c, "r"), (1, 10), "{store}");
    drop(role);
    c.batch_execute("DROP ROLE rl_many").expect("drop the role");
}

#[test]
fn every_misuse_of_reservations_over_several_policies_gets_its_sqlstate() {
    for store in stores() {
        misuse(store);
    }
}
