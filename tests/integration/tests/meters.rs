//! Weighted meters against a real server, in every store of the edition under test:
//! - a policy's meters (`{"input": 0.2, "output": 1, "cached": 0.05}`) weigh the amounts `reserve` and
//!   `settle` are given into tokens, rounded up: exact values through the key's bucket, a second settle
//!   changing nothing, an excess charged as debt, and a change of meters used by the next call of every
//!   session;
//! - from 16 connections at once reserving and settling random amounts, every token is accounted for:
//!   the key's bucket lost exactly the weighted cost of what was settled, computed here independently;
//! - every misuse gets its SQLSTATE: amounts and tokens both (22023) or neither (22004), amounts on a
//!   policy without meters, a meter it does not have, an amount that is not whole (22023), a cost beyond a
//!   bigint (22003), meters that are not meters (22023); a role with only LOGIN settles its own
//!   reservation by amounts and cannot change the meters (42501).

use std::thread;

use postgres::Client;
use rate_limit_integration::{stores, TestDb};

const THREADS: u64 = 16;
const ROUNDS: u64 = 20;
const BURST: i64 = 100_000;
/// The meters' weights in millionths of a token, as the test computes costs on its own.
const WEIGHTS: [(&str, i64); 3] = [
    ("cached", 50_000),
    ("input", 200_000),
    ("output", 1_000_000),
];

/// What `amounts` cost by the weights, rounded up: the reference the server's answers are checked with.
fn cost(amounts: &[(&str, i64)]) -> i64 {
    let millionths: i64 = amounts
        .iter()
        .map(|(name, amount)| {
            let weight = WEIGHTS.iter().find(|(n, _)| n == name).expect("a meter").1;
            weight * amount
        })
        .sum();
    (millionths + 999_999) / 1_000_000
}

/// `amounts` as the JSON text the functions take.
fn json(amounts: &[(&str, i64)]) -> String {
    let pairs: Vec<String> = amounts
        .iter()
        .map(|(n, a)| format!("\"{n}\": {a}"))
        .collect();
    format!("{{{}}}", pairs.join(", "))
}

/// A database with policy `llm` (100 000 tokens per 1000 days, one in 14.4 minutes: less than a token
/// refills while a test runs; burst 100 000, max_debt 100 000) with the test's meters, in `store`.
fn llm_policy(name: &str, store: &str) -> TestDb {
    let db = TestDb::new(&format!("meters_{name}_{store}"));
    let mut admin = db.connect();
    admin
        .batch_execute("SET rate_limit.max_policy_refill_time = '200000d'")
        .expect("raise the bound");
    admin
        .execute(
            "SELECT rate_limit.create_policy('llm', $1, '1000 days', max_debt => 100000, store => $2, \
             options => '{\"meters\": {\"input\": 0.2, \"output\": 1, \"cached\": 0.05}}')",
            &[&BURST, &store],
        )
        .expect("create policy");
    db
}

/// The key's bucket's tokens now, its reservations' buckets left out (whole: nothing refills).
fn tokens(c: &mut Client, key: &str) -> i64 {
    c.query_one(
        "SELECT coalesce(floor(sum(tokens))::bigint, $2) FROM rate_limit.buckets \
         WHERE policy = 'llm' AND key = $1 AND algorithm <> 'reservation'",
        &[&key, &BURST],
    )
    .expect("buckets")
    .get(0)
}

/// A reserve by amounts: its id when granted.
fn reserve(c: &mut Client, key: &str, amounts: &[(&str, i64)]) -> Option<i64> {
    c.query_one(
        "SELECT lease FROM rate_limit.reserve('llm', $1, amounts => $2::text::jsonb)",
        &[&key, &json(amounts)],
    )
    .expect("reserve")
    .get(0)
}

/// A settle by amounts: whether this call settled it.
fn settle(c: &mut Client, key: &str, id: i64, amounts: &[(&str, i64)]) -> bool {
    c.query_one(
        "SELECT allowed FROM rate_limit.settle('llm', $1, $2, amounts => $3::text::jsonb)",
        &[&key, &id, &json(amounts)],
    )
    .expect("settle")
    .get(0)
}

fn exact_values(store: &str) {
    let db = llm_policy("exact", store);
    let mut c = db.connect();
    let meters: String = c
        .query_one(
            "SELECT meters::text FROM rate_limit.policies WHERE name = 'llm'",
            &[],
        )
        .expect("the policy's meters")
        .get(0);
    assert_eq!(
        meters, r#"{"input": 0.2, "cached": 0.05, "output": 1}"#,
        "{store}: the meters as stored, a whole weight as an integer"
    );
    // 1000 × 0.2 + 4000 × 1 = 4200 reserved; 1000 × 0.2 + 300 × 1 + 21 × 0.05 = 501.05 used: 502
    let id = reserve(&mut c, "k", &[("input", 1000), ("output", 4000)]).expect("granted");
    assert_eq!(tokens(&mut c, "k"), BURST - 4200, "{store}");
    assert!(settle(
        &mut c,
        "k",
        id,
        &[("input", 1000), ("output", 300), ("cached", 21)]
    ));
    assert_eq!(tokens(&mut c, "k"), BURST - 502, "{store}: rounded up");
    assert!(
        !settle(&mut c, "k", id, &[("output", 1)]),
        "{store}: settled once"
    );
    assert_eq!(tokens(&mut c, "k"), BURST - 502, "{store}");
    // 100 tokens reserved, 150 used: 50 charged beyond them
    let id: i64 = c
        .query_one("SELECT lease FROM rate_limit.reserve('llm', 'k', 100)", &[])
        .expect("reserve tokens")
        .get(0);
    assert!(settle(&mut c, "k", id, &[("output", 150)]));
    assert_eq!(
        tokens(&mut c, "k"),
        BURST - 652,
        "{store}: the excess charged"
    );
    // a change of weights is the next call's, in another session too
    let mut other = db.connect();
    let id = reserve(&mut other, "k", &[("output", 10)]).expect("granted");
    db.connect()
        .batch_execute(
            "SELECT rate_limit.alter_policy('llm', options => '{\"meters\": {\"input\": 0.2, \"output\": 3}}')",
        )
        .expect("new weights");
    assert!(settle(&mut other, "k", id, &[("output", 10)]));
    assert_eq!(
        tokens(&mut other, "k"),
        BURST - 652 - 30,
        "{store}: settled at the new weight"
    );
    let refused = other
        .query_one(
            "SELECT rate_limit.reserve('llm', 'k', amounts => '{\"cached\": 1}')",
            &[],
        )
        .expect_err("a meter removed");
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("22023"),
        "{store}: {refused}"
    );
}

#[test]
fn amounts_are_weighed_exactly_and_a_change_of_meters_is_the_next_calls() {
    for store in stores() {
        exact_values(store);
    }
}

/// One connection's rounds: reserve random amounts, then settle random amounts (some left unsettled,
/// some settled twice); what it consumed by the test's own weighing.
fn one_connection(mut c: Client, seed: u64) -> i64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut below = |n: u64| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        i64::try_from(x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n).unwrap_or(0)
    };
    let mut consumed = 0;
    for _ in 0..ROUNDS {
        let estimate = [("input", below(250)), ("output", 1 + below(150))];
        let id = reserve(&mut c, "shared", &estimate).expect("the burst covers every reservation");
        match below(6) {
            0 => consumed += cost(&estimate), // left unsettled: its estimate stays taken
            n => {
                let used = [
                    ("input", below(250)),
                    ("output", below(200)),
                    ("cached", below(100)),
                ];
                assert!(settle(&mut c, "shared", id, &used));
                consumed += cost(&used);
                if n == 1 {
                    assert!(!settle(&mut c, "shared", id, &used), "once");
                }
            }
        }
    }
    consumed
}

fn sixteen_connections(store: &str) {
    let db = llm_policy("hammer", store);
    let handles: Vec<_> = (0..THREADS)
        .map(|seed| {
            let c = db.connect();
            thread::spawn(move || one_connection(c, seed))
        })
        .collect();
    let consumed: i64 = handles
        .into_iter()
        .map(|h| h.join().expect("a connection"))
        .sum();
    assert_eq!(
        tokens(&mut db.connect(), "shared"),
        BURST - consumed,
        "{store}: every weighed token accounted for"
    );
}

#[test]
fn weighed_reservations_are_exact_under_16_connections() {
    for store in stores() {
        sixteen_connections(store);
    }
}

fn misuse(store: &str) {
    let db = llm_policy("misuse", store);
    let mut c = db.connect();
    c.batch_execute("SELECT rate_limit.create_policy('plain', 10, '1 minute')")
        .expect("a policy without meters");
    let id = reserve(&mut c, "k", &[("output", 5)]).expect("granted");
    let state = |c: &mut Client, sql: &str| -> String {
        c.query(sql, &[])
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| e.code().map_or("none".into(), |s| s.code().to_string()))
    };
    let cases = [
        (format!("SELECT rate_limit.settle('llm', 'k', {id}, 5, '{{\"output\": 1}}')"), "22023"),
        (format!("SELECT rate_limit.settle('llm', 'k', {id})"), "22004"),
        ("SELECT rate_limit.reserve('llm', 'k')".to_string(), "22004"),
        ("SELECT rate_limit.reserve('plain', 'k', amounts => '{\"output\": 1}')".to_string(), "22023"),
        ("SELECT rate_limit.reserve('llm', 'k', amounts => '{\"outputs\": 1}')".to_string(), "22023"),
        ("SELECT rate_limit.reserve('llm', 'k', amounts => '{\"output\": 1.5}')".to_string(), "22023"),
        ("SELECT rate_limit.reserve('llm', 'k', amounts => '{\"output\": -1}')".to_string(), "22023"),
        ("SELECT rate_limit.reserve('llm', 'k', amounts => '{\"output\": \"1\"}')".to_string(), "22023"),
        ("SELECT rate_limit.reserve('llm', 'k', amounts => '[1]')".to_string(), "22023"),
        ("SELECT rate_limit.reserve('llm', 'k', amounts => '{}')".to_string(), "22023"),
        ("SELECT rate_limit.reserve('llm', 'k', amounts => '{\"cached\": 0}')".to_string(), "22023"),
        (
            "SELECT rate_limit.reserve('llm', 'k', amounts => '{\"output\": 9223372036854775807, \"input\": 5}')"
                .to_string(),
            "22003",
        ),
        (format!("SELECT rate_limit.settle('llm', 'k', {id}, amounts => '{{\"output\": 1e400}}')"), "22023"),
        ("SELECT rate_limit.alter_policy('llm', options => '{\"meters\": {}}')".to_string(), "22023"),
        ("SELECT rate_limit.alter_policy('llm', options => '{\"meters\": [1]}')".to_string(), "22023"),
        ("SELECT rate_limit.alter_policy('llm', options => '{\"meters\": {\"In\": 1}}')".to_string(), "22023"),
        ("SELECT rate_limit.alter_policy('llm', options => '{\"meters\": {\"a\": 0.0000001}}')".to_string(), "22023"),
        ("SELECT rate_limit.alter_policy('llm', options => '{\"meters\": {\"a\": 1000001}}')".to_string(), "22023"),
        ("SELECT rate_limit.alter_policy('llm', options => '{\"meters\": {\"a\": \"1\"}}')".to_string(), "22023"),
        (
            format!(
                "SELECT rate_limit.alter_policy('llm', options => '{{\"meters\": {{{}}}}}')",
                (0..17).map(|i| format!("\"m{i}\": 1")).collect::<Vec<_>>().join(", ")
            ),
            "22023",
        ),
    ];
    for (sql, expected) in &cases {
        assert_eq!(&state(&mut c, sql), expected, "{store}: {sql}");
    }
    // nothing of it changed the key's bucket nor the meters
    assert_eq!(tokens(&mut c, "k"), BURST - 5, "{store}");
    assert!(settle(&mut c, "k", id, &[("output", 5)]));
    // a role with only LOGIN settles its own reservation by amounts; it cannot change the meters
    let mut role = db.connect_as_login_role("rl_meters");
    let id = reserve(&mut role, "r", &[("input", 10)]).expect("granted");
    assert!(settle(&mut role, "r", id, &[("input", 5)]));
    assert_eq!(tokens(&mut c, "r"), BURST - 1, "{store}: 5 × 0.2 = 1");
    assert_eq!(
        state(
            &mut role,
            "SELECT rate_limit.alter_policy('llm', options => '{\"meters\": {\"input\": 0}}')"
        ),
        "42501",
        "{store}"
    );
    drop(role);
    c.batch_execute("DROP ROLE rl_meters")
        .expect("drop the role");
}

#[test]
fn every_misuse_of_meters_and_amounts_gets_its_sqlstate() {
    for store in stores() {
        misuse(store);
    }
}
