//! The two editions are one model: the same random calls give the same answers. One plan of at least 100 000
//! calls (every algorithm, costs of 0 to several tokens, several keys per call, batches, overrides set and
//! cleared, blocks and penalty boxes, refunds, charges into debt, leases, reservations made and settled (in
//! tokens or in amounts of weighted meters, under one policy or two, twice, late, with ids nobody was given),
//! shadow mode, policy changes) runs in two databases of the faketime server, the compiled edition in one and
//! the portable edition in the other, on a frozen clock that the test steps between runs of calls: forward by
//! microseconds to hours, and back. Every answer (the decision's allowed, remaining, limit, retry_after,
//! reset_after, policy and shadow_denied; a count, a boolean, a header, the tokens to the millionth, or the
//! SQLSTATE of an error) must be the same in both.
//!
//! The plan is drawn from a seeded generator (`RATE_LIMIT_DIFFERENTIAL_SEED` replays another plan,
//! `RATE_LIMIT_DIFFERENTIAL_CALLS` sizes it); the first difference fails the test with the call, the
//! clock and the calls before it.

use std::fmt::Write as _;

use postgres::{Client, SimpleQueryMessage};
use rate_limit_integration::{env, Edition, TestDb};

/// SplitMix64: a small generator whose plan is the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The policies both databases start with: every algorithm, debt, a penalty box, shadow mode, leases
/// fixed and adaptive, a child (`kid`, whose calls also take from `tb`).
const SETUP: &str = "
SELECT rate_limit.create_policy('tb', 3, '7 seconds', burst => 5, max_debt => 4,
    options => '{\"meters\": {\"input\": 0.25, \"output\": 1.5}}');
SELECT rate_limit.create_policy('tb_fast', 1000, '1 second', burst => 50);
SELECT rate_limit.create_policy('fw', 4, '10 seconds', algorithm => 'fixed_window', max_debt => 2);
SELECT rate_limit.create_policy('sw', 5, '6 seconds', algorithm => 'sliding_window', max_debt => 3);
SELECT rate_limit.create_policy('cal', 6, '1 day', algorithm => 'calendar_window', time_zone => 'Europe/Paris');
SELECT rate_limit.create_policy('cal_m', 20, '1 month', algorithm => 'calendar_window',
                                time_zone => 'America/New_York', anchor => '2026-01-31 00:00', max_debt => 5);
SELECT rate_limit.create_policy('pen', 2, '5 seconds', burst => 2, block_after => 3, block_for => '20 seconds');
SELECT rate_limit.create_policy('pen_w', 3, '4 seconds', algorithm => 'sliding_window', block_after => 2,
                                block_for => '9 seconds');
SELECT rate_limit.create_policy('sh', 2, '10 seconds', shadow => true);
SELECT rate_limit.create_policy('kid', 2, '5 seconds', burst => 3, max_debt => 2,
    options => '{\"parent\": \"tb\"}');
SELECT rate_limit.create_policy('conc', 2, '30 seconds', algorithm => 'concurrency');
SELECT rate_limit.create_policy('conc_a', 4, '20 seconds', algorithm => 'concurrency',
                                options => '{\"latency_target\": \"1 second\", \"adaptive_min\": 1}');
";

/// Policies that take tokens, and the keys every call picks from.
const TOKEN_POLICIES: &[&str] = &[
    "tb", "tb_fast", "fw", "sw", "cal", "cal_m", "pen", "pen_w", "sh", "kid",
];
const KEYS: &[&str] = &["a", "b", "c", "d", "e"];
/// The concurrency policies: fixed leases, and adaptive ones.
const LEASE_POLICIES: &[&str] = &["conc", "conc_a"];

/// One call of the plan: its SQL (one statement answering one text value) for both editions; a lease
/// to release is named by its position among the leases each database holds, and a reservation to settle
/// by its position among the reservations each database made.
enum Call {
    Sql(String),
    Acquire {
        policy: &'static str,
        key: String,
    },
    /// A release of the `nth` lease each database holds of the key, reporting an outcome and a latency
    /// (`None`: NULL, the time the lease was held).
    Release {
        policy: &'static str,
        key: String,
        nth: u64,
        outcome: &'static str,
        latency_ms: Option<u64>,
    },
    Reserve {
        policy: String,
        key: String,
        estimate: u64,
        hold_seconds: u64,
    },
    Settle {
        nth: u64,
        actual: u64,
    },
    Book {
        policy: String,
        key: String,
        cost: u64,
        max_delay_seconds: u64,
    },
    /// A cancel of the `nth` booking each database made (modulo how many), now and then of an id nobody
    /// was given.
    Cancel {
        nth: u64,
    },
}

/// A decision, as text, without its lease (each edition draws its own random lease ids).
fn decision(from: &str) -> String {
    format!(
        "SELECT (d.allowed, d.remaining, d.\"limit\", d.retry_after, d.reset_after, d.policy, d.shadow_denied)::text \
         FROM {from} AS d"
    )
}

fn draw(rng: &mut Rng) -> Call {
    let policy = rng.pick(TOKEN_POLICIES);
    let key = rng.pick(KEYS);
    let cost = rng.below(4);
    let sql = match rng.below(100) {
        0..=17 => decision(&format!("rate_limit.take('{policy}', '{key}', {cost})")),
        18 if rng.chance(50) => {
            return Call::Book {
                policy: policy.to_string(),
                key: key.to_string(),
                cost: 1 + rng.below(3),
                max_delay_seconds: rng.below(40),
            }
        }
        20 if rng.chance(50) => return Call::Cancel { nth: rng.next() },
        18..=19 => {
            return Call::Reserve {
                policy: policy.to_string(),
                key: key.to_string(),
                estimate: 1 + rng.below(4),
                hold_seconds: 1 + rng.below(60),
            }
        }
        20..=21 => {
            return Call::Settle {
                nth: rng.next(),
                actual: rng.below(7),
            }
        }
        22..=27 => {
            let other = rng.pick(TOKEN_POLICIES);
            if other == policy {
                decision(&format!("rate_limit.take('{policy}', '{key}')"))
            } else if rng.chance(50) {
                decision(&format!(
                    "rate_limit.take_many(ARRAY['{policy}', '{other}'], ARRAY['{key}'], {})",
                    1 + rng.below(2)
                ))
            } else {
                let key2 = rng.pick(KEYS);
                decision(&format!(
                    "rate_limit.take_many(ARRAY['{policy}', '{other}'], ARRAY['{key}', '{key2}'])"
                ))
            }
        }
        28..=33 => {
            let n = 2 + rng.below(4);
            let keys: Vec<String> = (0..n).map(|_| format!("'{}'", rng.pick(KEYS))).collect();
            let costs: Vec<String> = (0..n).map(|_| (1 + rng.below(2)).to_string()).collect();
            let all = rng.chance(30);
            // an all-or-nothing batch names each key once, with one cost
            let (keys, costs) = if all {
                let mut distinct = keys.clone();
                distinct.sort();
                distinct.dedup();
                let c = vec!["1".to_string(); distinct.len()];
                (distinct, c)
            } else {
                (keys, costs)
            };
            format!(
                "SELECT string_agg((b.ordinality, b.key, b.allowed, b.remaining, b.retry_after)::text, ' ' \
                 ORDER BY b.ordinality) FROM rate_limit.take_batch('{policy}', ARRAY[{}], ARRAY[{}], {all}) AS b",
                keys.join(", "),
                costs.join(", ")
            )
        }
        34..=38 => decision(&format!(
            "rate_limit.take_ad_hoc('{key}', {}, '{} seconds', {}, {cost})",
            1 + rng.below(4),
            1 + rng.below(5),
            1 + rng.below(6)
        )),
        39..=43 => decision(&format!("rate_limit.peek('{policy}', '{key}')")),
        44..=49 => decision(&format!(
            "rate_limit.charge('{policy}', '{key}', {})",
            rng.below(7)
        )),
        50..=53 => decision(&format!(
            "rate_limit.refund('{policy}', '{key}', {})",
            rng.below(4)
        )),
        54..=55 => format!("SELECT rate_limit.reset('{policy}', '{key}')::text"),
        56..=63 => format!(
            "SELECT rate_limiting_request('{key}', {}, {})::text",
            1 + rng.below(3),
            1 + rng.below(5)
        ),
        64..=65 => format!("SELECT rate_limit.peek_request('{key}', 2, 3)::text"),
        66..=67 => format!("SELECT rate_limit.tokens('{key}', 2, 3)::text"),
        68..=72 => {
            return Call::Acquire {
                policy: rng.pick(LEASE_POLICIES),
                key: key.to_string(),
            }
        }
        73 => "SELECT coalesce(string_agg(b.key || ' ' || b.tokens, ',' ORDER BY b.key), 'none') \
               FROM rate_limit.buckets AS b WHERE b.policy = 'conc_a' AND b.algorithm = 'adaptive_limit'"
            .to_string(),
        74..=77 => {
            return Call::Release {
                policy: rng.pick(LEASE_POLICIES),
                key: key.to_string(),
                nth: rng.next(),
                outcome: rng.pick(&["ok", "ok", "dropped", "timeout"]),
                latency_ms: rng.chance(70).then(|| rng.below(2000)),
            }
        }
        78..=79 => decision(&format!(
            "rate_limit.block('{policy}', '{key}', '{} seconds')",
            1 + rng.below(30)
        )),
        80..=81 => format!("SELECT rate_limit.unblock('{policy}', '{key}')::text"),
        82..=86 => {
            let until = if rng.chance(40) {
                format!(", until => clock_timestamp() + interval '{} seconds'", 1 + rng.below(40))
            } else {
                String::new()
            };
            let what = match rng.below(5) {
                0 => "action => 'deny'".to_string(),
                1 => "action => 'exempt'".to_string(),
                2 => format!("rate => {}", 1 + rng.below(9)),
                3 => format!("burst => {}", 1 + rng.below(9)),
                _ => format!("rate => {}, burst => {}", 1 + rng.below(9), 1 + rng.below(9)),
            };
            format!("SELECT rate_limit.set_override('{policy}', '{key}', {what}{until})::text")
        }
        87..=88 => format!("SELECT rate_limit.clear_override('{policy}', '{key}')::text"),
        89..=90 => {
            let change = match policy {
                "fw" | "sw" | "pen_w" | "cal" | "cal_m" => format!("rate => {}", 2 + rng.below(5)),
                _ => format!("rate => {}, burst => {}", 1 + rng.below(5), 2 + rng.below(5)),
            };
            format!("SELECT rate_limit.alter_policy('{policy}', {change})::text")
        }
        91..=94 => format!(
            "SELECT rate_limit.headers(d)::text FROM rate_limit.take('{policy}', '{key}', {cost}) AS d"
        ),
        _ => decision(&format!(
            "rate_limit.wait('{policy}', '{key}', {cost}, '0 seconds')"
        )),
    };
    Call::Sql(sql)
}

/// One run of calls at one clock reading.
struct Segment {
    /// The frozen clock, as libfaketime reads it.
    clock: String,
    calls: Vec<Call>,
}

/// The plan: `total` calls in runs of 1 to 40, between clock steps.
fn plan(seed: u64, total: usize) -> Vec<Segment> {
    let mut rng = Rng(seed);
    // microseconds since 2026-11-28 22:00:00 UTC: Paris's midnight comes two hours in
    let mut us: i64 = 0;
    let mut segments = Vec::new();
    let mut drawn = 0;
    while drawn < total {
        us += match rng.below(100) {
            0..=59 => rng.below(3_000_000) as i64,
            60..=79 => rng.below(20_000) as i64,
            80..=89 => rng.below(120_000_000) as i64,
            90..=93 => rng.below(7_200_000_000) as i64,
            94..=95 => rng.below(40 * 86_400_000_000) as i64,
            _ => -(rng.below(90_000_000) as i64),
        };
        let n = (1 + rng.below(40) as usize).min(total - drawn);
        let calls = (0..n).map(|_| draw(&mut rng)).collect();
        drawn += n;
        segments.push(Segment {
            clock: clock_at(us),
            calls,
        });
    }
    segments
}

/// The libfaketime absolute time `us` microseconds after 2026-11-28 22:00:00 UTC (the server's clock is
/// UTC: the file holds a wall-clock time in the server's TZ, which the test cluster leaves at UTC).
fn clock_at(us: i64) -> String {
    let start = 1_795_903_200i64; // 2026-11-28 22:00:00 UTC, in Unix seconds
    let secs = start + us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{micros:06}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The date of a day number since 1970-01-01 (H. Hinnant's civil_from_days).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// One edition's connection, the leases it holds and the reservations it made (policy, key, id).
struct Side {
    client: Client,
    leases: Vec<(String, i64)>,
    reservations: Vec<(Vec<String>, String, i64)>,
    bookings: Vec<(String, String, i64)>,
}

/// A decision's columns but its lease, as text, and whether it has a lease.
const DECISION_AND_LEASE: &str =
    "(d.allowed, d.remaining, d.\"limit\", d.retry_after, d.reset_after, d.policy, \
     d.shadow_denied, d.lease IS NOT NULL)::text, d.lease";

impl Side {
    /// The answer to `sql` as text: its one value, or `error SQLSTATE`.
    fn answer(&mut self, sql: &str) -> String {
        match self.client.simple_query(sql) {
            Ok(messages) => messages
                .iter()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_string()),
                    _ => None,
                })
                .unwrap_or_else(|| "no row".to_string()),
            Err(e) => format!(
                "error {}",
                e.code().map(|c| c.code().to_string()).unwrap_or_default()
            ),
        }
    }

    fn run(&mut self, call: &Call) -> String {
        match call {
            Call::Sql(sql) => self.answer(sql),
            Call::Acquire { policy, key } => {
                let row = self
                    .client
                    .query_one(
                        "SELECT (d.allowed, d.remaining, d.\"limit\", d.retry_after, d.reset_after, d.policy)::text, \
                         d.lease FROM rate_limit.acquire($1, $2) AS d",
                        &[policy, key],
                    )
                    .expect("acquire");
                if let Some(lease) = row.get::<_, Option<i64>>(1) {
                    self.leases.push((format!("{policy} {key}"), lease));
                }
                row.get(0)
            }
            Call::Release {
                policy,
                key,
                nth,
                outcome,
                latency_ms,
            } => {
                let held_as = format!("{policy} {key}");
                let mine: Vec<usize> = (0..self.leases.len())
                    .filter(|&i| self.leases[i].0 == held_as)
                    .collect();
                if mine.is_empty() {
                    return "no lease".to_string();
                }
                let i = mine[(*nth % mine.len() as u64) as usize];
                let (_, lease) = self.leases.remove(i);
                let latency = latency_ms.map(|ms| ms as f64);
                let released: bool = self
                    .client
                    .query_one(
                        "SELECT rate_limit.release($1, $2, $3, $4, $5::float8 * interval '1 millisecond')",
                        &[policy, key, &lease, outcome, &latency],
                    )
                    .expect("release")
                    .get(0);
                released.to_string()
            }
            Call::Reserve {
                policy,
                key,
                estimate,
                hold_seconds,
            } => {
                // one in four by weighted meters (only 'tb' has them: the others refuse with 22023)
                let amounts = (hold_seconds % 4 == 0)
                    .then(|| format!("{{\"output\": {estimate}, \"input\": {hold_seconds}}}"));
                // one in three under a second policy too (reserve_many), estimates of its own
                let also =
                    TOKEN_POLICIES[((estimate + hold_seconds) as usize) % TOKEN_POLICIES.len()];
                let policies: Vec<String> = if hold_seconds % 3 == 1 && also != policy {
                    vec![policy.clone(), also.to_string()]
                } else {
                    vec![policy.clone()]
                };
                let row = if policies.len() == 1 {
                    let estimate = (amounts.is_none()).then_some(*estimate as i64);
                    self.client.query_one(
                        &format!(
                            "SELECT {DECISION_AND_LEASE} FROM rate_limit.reserve($1, $2, $3, \
                             make_interval(secs => $4), $5::text::jsonb) AS d"
                        ),
                        &[policy, key, &estimate, &(*hold_seconds as f64), &amounts],
                    )
                } else {
                    let estimates = (amounts.is_none())
                        .then(|| vec![*estimate as i64, 1 + *estimate as i64 / 2]);
                    self.client.query_one(
                        &format!(
                            "SELECT {DECISION_AND_LEASE} FROM rate_limit.reserve_many($1, $2, $3, \
                             make_interval(secs => $4), $5::text::jsonb) AS d"
                        ),
                        &[
                            &policies,
                            key,
                            &estimates,
                            &(*hold_seconds as f64),
                            &amounts,
                        ],
                    )
                }
                .map_err(|e| format!("error {}", e.code().map(|c| c.code()).unwrap_or_default()));
                match row {
                    Ok(row) => {
                        if let Some(id) = row.get::<_, Option<i64>>(1) {
                            self.reservations.push((policies, key.clone(), id));
                        }
                        row.get(0)
                    }
                    Err(e) => e,
                }
            }
            Call::Book {
                policy,
                key,
                cost,
                max_delay_seconds,
            } => {
                let row = self
                    .client
                    .query_one(
                        &format!(
                            "SELECT {DECISION_AND_LEASE} FROM rate_limit.book($1, $2, $3, \
                             make_interval(secs => $4)) AS d"
                        ),
                        &[policy, key, &(*cost as i64), &(*max_delay_seconds as f64)],
                    )
                    .map_err(|e| {
                        format!("error {}", e.code().map(|c| c.code()).unwrap_or_default())
                    });
                match row {
                    Ok(row) => {
                        if let Some(id) = row.get::<_, Option<i64>>(1) {
                            self.bookings.push((policy.clone(), key.clone(), id));
                        }
                        row.get(0)
                    }
                    Err(e) => e,
                }
            }
            Call::Cancel { nth } => {
                if self.bookings.is_empty() {
                    return "no booking".to_string();
                }
                let i = (*nth % self.bookings.len() as u64) as usize;
                let (policy, key, id) = self.bookings[i].clone();
                // now and then one nobody was given
                let id = if nth % 7 == 0 { -id } else { id };
                let row = self
                    .client
                    .query_one(
                        &format!(
                            "SELECT {DECISION_AND_LEASE} FROM rate_limit.cancel_booking($1, $2, $3) AS d"
                        ),
                        &[&policy, &key, &id],
                    )
                    .map_err(|e| format!("error {}", e.code().map(|c| c.code()).unwrap_or_default()));
                match row {
                    Ok(row) => row.get(0),
                    Err(e) => e,
                }
            }
            Call::Settle { nth, actual } => {
                if self.reservations.is_empty() {
                    return "no reservation".to_string();
                }
                let i = (*nth % self.reservations.len() as u64) as usize;
                let (policies, key, id) = self.reservations[i].clone();
                // now and then one nobody was given
                let id = if nth % 7 == 0 { -id } else { id };
                // one in three by weighted meters
                let amounts = (nth % 3 == 0)
                    .then(|| format!("{{\"input\": {actual}, \"output\": {}}}", actual / 2));
                let row = if let [policy] = &policies[..] {
                    let actual = (amounts.is_none()).then_some(*actual as i64);
                    self.client.query_one(
                        &format!(
                            "SELECT {DECISION_AND_LEASE} FROM rate_limit.settle($1, $2, $3, $4, $5::text::jsonb) AS d"
                        ),
                        &[policy, &key, &id, &actual, &amounts],
                    )
                } else {
                    let actuals = (amounts.is_none()).then(|| vec![*actual as i64, *actual as i64 / 2]);
                    self.client.query_one(
                        &format!(
                            "SELECT {DECISION_AND_LEASE} FROM rate_limit.settle_many($1, $2, $3, $4, $5::text::jsonb) AS d"
                        ),
                        &[&policies, &key, &id, &actuals, &amounts],
                    )
                }
                .map_err(|e| format!("error {}", e.code().map(|c| c.code()).unwrap_or_default()));
                match row {
                    Ok(row) => row.get(0),
                    Err(e) => e,
                }
            }
        }
    }
}

#[test]
fn a_hundred_thousand_random_calls_get_the_same_answers_from_both_editions() {
    let server = env("RATE_LIMIT_TEST_FAKETIME_CONNINFO");
    let file = env("RATE_LIMIT_TEST_FAKETIME_FILE");
    let seed = std::env::var("RATE_LIMIT_DIFFERENTIAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026);
    let total = std::env::var("RATE_LIMIT_DIFFERENTIAL_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let segments = plan(seed, total);
    let set_clock =
        |clock: &str| std::fs::write(&file, format!("{clock}\n")).expect("faketime file");
    set_clock(&segments[0].clock);
    let compiled = TestDb::with_edition(&server, "differential_compiled", Edition::Compiled);
    let portable = TestDb::with_edition(&server, "differential_portable", Edition::Portable);
    let mut sides = [compiled.connect(), portable.connect()].map(|mut client| {
        client.batch_execute(SETUP).expect("the policies");
        Side {
            client,
            leases: Vec::new(),
            reservations: Vec::new(),
            bookings: Vec::new(),
        }
    });
    let mut history = String::new();
    let mut compared = 0usize;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for segment in &segments {
            set_clock(&segment.clock);
            let [a, b] = &mut sides;
            let (answers_a, answers_b) = std::thread::scope(|s| {
                let ta = s.spawn(|| segment.calls.iter().map(|c| a.run(c)).collect::<Vec<_>>());
                let tb = s.spawn(|| segment.calls.iter().map(|c| b.run(c)).collect::<Vec<_>>());
                (
                    ta.join().expect("the compiled side"),
                    tb.join().expect("the portable side"),
                )
            });
            for ((call, x), y) in segment.calls.iter().zip(&answers_a).zip(&answers_b) {
                let shown = match call {
                    Call::Sql(sql) => sql.clone(),
                    Call::Acquire { policy, key } => format!("acquire('{policy}', '{key}')"),
                    Call::Release {
                        policy,
                        key,
                        outcome,
                        latency_ms,
                        ..
                    } => {
                        format!("release('{policy}', '{key}', ..., '{outcome}', {latency_ms:?} ms)")
                    }
                    Call::Reserve {
                        policy,
                        key,
                        estimate,
                        hold_seconds,
                    } => format!("reserve('{policy}', '{key}', {estimate}, '{hold_seconds} s')"),
                    Call::Settle { nth, actual } => format!("settle(#{nth}, {actual})"),
                    Call::Book {
                        policy,
                        key,
                        cost,
                        max_delay_seconds,
                    } => format!("book('{policy}', '{key}', {cost}, '{max_delay_seconds} s')"),
                    Call::Cancel { nth } => format!("cancel_booking(#{nth})"),
                };
                assert_eq!(
                    x, y,
                    "call {compared} at {}: {shown}\ncompiled: {x}\nportable: {y}\nthe calls before it:\n{history}",
                    segment.clock
                );
                compared += 1;
                let _ = writeln!(history, "  {}: {shown} -> {x}", segment.clock);
                if history.len() > 6000 {
                    history.drain(..history.len() - 4000);
                }
            }
        }
    }));
    set_clock("+0");
    if std::env::var("RATE_LIMIT_DIFFERENTIAL_KEEP").is_ok() {
        // kept to look into: rl_it_differential_compiled and rl_it_differential_portable
        std::mem::forget(compiled);
        std::mem::forget(portable);
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert!(compared >= total, "{compared} calls compared");
    eprintln!("{compared} calls, the same answers from both editions (seed {seed:#x})");
}
