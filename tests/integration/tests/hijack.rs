//! No caller can change what another call sees. An unprivileged role creates its own `=`, `<`, `>=`, `+`,
//! `*` and `||` operators, look-alike functions, tables and a `text` domain in a schema it puts before
//! `pg_catalog`, then, as the first calls of a fresh backend (so that every plan the extension keeps is
//! prepared under that search_path), calls every function PUBLIC may call, in both stores (the table store
//! alone in the portable edition). Every result
//! must equal a clean session's, a strict policy must still deny, and the same backend, handed to another
//! client as a transaction pooler would, must still behave.

use postgres::Client;
use rate_limit_integration::{edition, Edition, TestDb};

const ATTACK: &str = "
CREATE FUNCTION evil.yes(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION evil.yes(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION evil.yes(bigint, integer) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION evil.yes(timestamptz, timestamptz) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION evil.big(bigint, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1000000000000::bigint';
CREATE FUNCTION evil.cat(text, text) RETURNS text LANGUAGE sql AS $$ SELECT 'strict' $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes);
CREATE OPERATOR evil.< (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes);
CREATE OPERATOR evil.>= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes);
CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes);
CREATE OPERATOR evil.>= (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = evil.yes);
CREATE OPERATOR evil.= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.yes);
CREATE OPERATOR evil.+ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.big);
CREATE OPERATOR evil.* (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.big);
CREATE OPERATOR evil.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.cat);
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2999-01-01' $$;
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2999-01-01' $$;
CREATE FUNCTION evil.greatest(bigint, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1000000000000::bigint';
CREATE DOMAIN evil.text AS pg_catalog.varchar(1);
CREATE TABLE evil.bucket_state (namespace pg_catalog.text, key pg_catalog.text, level bigint,
    updated_at timestamptz, algorithm pg_catalog.text, rate bigint, per_us bigint, burst bigint);
CREATE TABLE evil.policies (name pg_catalog.text, algorithm pg_catalog.text, rate bigint, per interval,
    burst bigint, store pg_catalog.text, created_at timestamptz, changed_at timestamptz);
INSERT INTO evil.policies VALUES ('strict', 'token_bucket', 1000, '1 second', 1000, NULL, now(), now());
CREATE TABLE evil.pg_type (oid oid, typrelid oid);
CREATE FUNCTION evil.has(jsonb, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.? (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = evil.has);
CREATE FUNCTION evil.field(jsonb, text) RETURNS text LANGUAGE sql AS $$ SELECT '0' $$;
CREATE OPERATOR evil.->> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = evil.field);
";

/// Every function PUBLIC may call, in both stores, with keys prefixed by `p`; each result as text. The
/// first call is `headers` of the strict policy, which used to cache a hijacked policy row.
fn scenario(client: &mut Client, p: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut row = |sql: &str| {
        let sql = sql.replace("{p}", p);
        let r = client
            .query_one(&format!("SELECT ({sql})::pg_catalog.text"), &[])
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        out.push(r.get::<_, String>(0));
    };
    row("SELECT rate_limit.headers(ROW(false, 0, 1, interval '1 day', interval '1 day', 'strict', false, NULL)::rate_limit.decision, 'strict')");
    row("SELECT public.rate_limiting_request('{p}r', 1, 10)");
    row("SELECT public.rate_limiting_request('{p}r', 1, 10)");
    row("SELECT rate_limit.peek_request('{p}r', 1, 10)");
    row("SELECT pg_catalog.floor(rate_limit.tokens('{p}r', 1, 10))");
    row("SELECT (allowed, remaining, \"limit\", retry_after > interval '23 hours', policy) FROM rate_limit.take('strict', 'victim')");
    row("SELECT (allowed, remaining, \"limit\", policy) FROM rate_limit.take('strict', '{p}s')");
    row("SELECT (allowed, remaining, \"limit\", policy) FROM rate_limit.take('strict', '{p}s')");
    row("SELECT (allowed, remaining, \"limit\", policy) FROM rate_limit.take('strict', '{p}s')");
    row("SELECT (allowed, remaining, \"limit\") FROM rate_limit.peek('strict', '{p}s')");
    row("SELECT (allowed, policy) FROM rate_limit.take_many(ARRAY['loose', 'strict'], ARRAY['{p}m'])");
    row("SELECT (allowed, policy) FROM rate_limit.take_many(ARRAY['loose', 'strict'], ARRAY['{p}m'])");
    row("SELECT (allowed, remaining) FROM rate_limit.peek('loose', '{p}m')");
    row("SELECT (allowed, remaining, \"limit\", policy) FROM rate_limit.take_ad_hoc('{p}a', 1, '1 hour', 2)");
    row("SELECT (allowed, remaining) FROM rate_limit.take_ad_hoc('{p}a', 1, '1 hour', 2)");
    row("SELECT (allowed, remaining) FROM rate_limit.take_ad_hoc('{p}a', 1, '1 hour', 2)");
    row("SELECT (allowed, remaining) FROM rate_limit.wait('strict', '{p}w', 1, '0 seconds')");
    row("SELECT (allowed, remaining) FROM rate_limit.wait('strict', '{p}w', 1, '0 seconds')");
    row("SELECT rate_limit.headers(d) FROM rate_limit.take('strict', '{p}h') AS d");
    row("SELECT rate_limit.headers(d) FROM rate_limit.take('strict', '{p}h') AS d");
    // reservations and bookings: their ids go back into the calls that settle and cancel them
    row("SELECT (allowed, remaining, lease IS NOT NULL) FROM rate_limit.reserve('budget', '{p}b', 30)");
    row("SELECT (s.allowed, s.remaining) FROM (SELECT lease FROM rate_limit.reserve('budget', '{p}b', 30)) AS r, \
         rate_limit.settle('budget', '{p}b', r.lease, 10) AS s");
    row("SELECT (allowed, retry_after > interval '11 hours', lease IS NOT NULL) FROM rate_limit.book('slots', '{p}k')");
    row("SELECT (allowed, retry_after > interval '11 hours', lease IS NOT NULL) FROM rate_limit.book('slots', '{p}k')");
    row("SELECT (c.allowed, c.remaining) FROM (SELECT lease FROM rate_limit.book('slots', '{p}k')) AS b, \
         rate_limit.cancel_booking('slots', '{p}k', b.lease) AS c");
    // weighted meters: 100 × 0.2 + 30 reserved, 7 × 0.2 = 1.4 used, rounded up to 2
    row(
        "SELECT (s.allowed, s.remaining) FROM (SELECT lease FROM rate_limit.reserve('metered', '{p}g', \
         amounts => '{\"input\": 100, \"output\": 30}')) AS r, \
         rate_limit.settle('metered', '{p}g', r.lease, amounts => '{\"input\": 7}') AS s",
    );
    // adaptive concurrency (a key's limit of 4 leases): a drop cuts it to 3.6 (3 slots), a report on a
    // lease nobody holds is refused, a slow call and a timeout acquired after the cuts cut to 3.24 and
    // 2.916 (2 slots)
    row(
        "SELECT (a.allowed, a.remaining, r) FROM rate_limit.acquire('conc', '{p}l') AS a, \
         rate_limit.release('conc', '{p}l', a.lease, 'dropped', interval '1 millisecond') AS r",
    );
    row("SELECT rate_limit.release('conc', '{p}l', 42, 'dropped')");
    row(
        "SELECT (a.allowed, a.remaining, r) FROM rate_limit.acquire('conc', '{p}l') AS a, \
         rate_limit.release('conc', '{p}l', a.lease, 'ok', interval '2 seconds') AS r",
    );
    row(
        "SELECT (a.allowed, a.remaining, r) FROM rate_limit.acquire('conc', '{p}l') AS a, \
         rate_limit.release('conc', '{p}l', a.lease, 'timeout') AS r",
    );
    row(
        "SELECT (a.allowed, a.remaining, r) FROM rate_limit.acquire('conc', '{p}l') AS a, \
         rate_limit.release('conc', '{p}l', a.lease, 'ok', interval '1 millisecond') AS r",
    );
    // a reservation over two policies, settled on what each counted
    row(
        "SELECT (s.allowed, s.remaining, s.policy) FROM (SELECT lease FROM rate_limit.reserve_many( \
         ARRAY['budget', 'metered'], '{p}n', ARRAY[20, 50])) AS r, \
         rate_limit.settle_many(ARRAY['budget', 'metered'], '{p}n', r.lease, ARRAY[5, 10]) AS s",
    );
    if edition() == Edition::Compiled {
        // the memory store (the portable edition has none)
        row("SELECT (allowed, remaining) FROM rate_limit.take('strict_memory', '{p}x')");
        row("SELECT (allowed, remaining) FROM rate_limit.take('strict_memory', '{p}x')");
        row("SELECT pg_catalog.set_config('rate_limit.store', 'memory', false)");
        row("SELECT public.rate_limiting_request('{p}r', 1, 10)");
        row("SELECT public.rate_limiting_request('{p}r', 1, 10)");
        row("SELECT rate_limit.peek_request('{p}r', 1, 10)");
        row("SELECT (allowed, remaining) FROM rate_limit.take_ad_hoc('{p}a', 1, '1 hour', 1)");
        row("SELECT (allowed, remaining) FROM rate_limit.take_ad_hoc('{p}a', 1, '1 hour', 1)");
        row("SELECT slot_bytes FROM rate_limit.memory_usage()");
        row("SELECT (a.allowed, a.remaining, r) FROM rate_limit.acquire('conc_memory', '{p}l') AS a, \
             rate_limit.release('conc_memory', '{p}l', a.lease, 'dropped', interval '1 millisecond') AS r");
        row("SELECT (a.allowed, a.remaining, r) FROM rate_limit.acquire('conc_memory', '{p}l') AS a, \
             rate_limit.release('conc_memory', '{p}l', a.lease + 1, 'dropped') AS r, \
             rate_limit.release('conc_memory', '{p}l', a.lease, 'ok') AS r2");
        row("SELECT pg_catalog.set_config('rate_limit.store', 'table', false)");
    }
    out
}

#[test]
fn look_alike_objects_before_pg_catalog_change_nothing() {
    let db = TestDb::new("hijack");
    let mut owner = db.connect();
    owner
        .batch_execute(
            "SELECT rate_limit.create_policy('strict', 1, '1 day', 1);
             SELECT rate_limit.create_policy('loose', 1000, '1 day', 1000);
             SELECT rate_limit.create_policy('strict_memory', 1, '1 day', 1, store => 'memory');
             SELECT rate_limit.create_policy('budget', 1000, '1 day', max_debt => 100);
             SELECT rate_limit.create_policy('slots', 2, '1 day', 1, max_debt => 3);
             SELECT rate_limit.create_policy('metered', 1000, '1 day',
                 options => '{\"meters\": {\"input\": 0.2, \"output\": 1}}');
             SELECT rate_limit.create_policy('conc', 4, '1 day', algorithm => 'concurrency',
                 options => '{\"latency_target\": \"1 second\"}');
             SELECT rate_limit.create_policy('conc_memory', 4, '1 day', algorithm => 'concurrency',
                 store => 'memory', options => '{\"latency_target\": \"1 second\"}');
             SELECT allowed FROM rate_limit.take('strict', 'victim');
             DROP ROLE IF EXISTS rl_attacker;
             CREATE ROLE rl_attacker;
             CREATE SCHEMA evil AUTHORIZATION rl_attacker;",
        )
        .expect("set up");

    let clean = scenario(&mut db.connect(), "c");
    // the clean answers are the right ones (so the comparison below cannot pass by being wrong twice)
    assert_eq!(clean[1..5], ["9", "8", "8", "8"]);
    assert_eq!(
        clean[5], "(f,0,1,t,strict)",
        "the drained strict bucket denies"
    );
    assert_eq!(
        clean[6..9],
        ["(t,0,1,strict)", "(f,0,1,strict)", "(f,0,1,strict)"]
    );
    assert_eq!(clean[10..12], ["(t,strict)", "(f,strict)"]);
    assert_eq!(
        clean[12], "(t,999)",
        "the denied multi-limit call took nothing from 'loose'"
    );
    assert_eq!(clean[16..18], ["(t,0)", "(f,0)"]);
    assert_eq!(
        clean[20..25],
        ["(t,970,t)", "(t,960)", "(t,f,f)", "(t,t,t)", "(t,0)"],
        "a reservation settled, the burst booked now, a booking for 12 hours on, the next one cancelled"
    );
    assert_eq!(
        clean[25], "(t,998)",
        "a weighed reservation settled by amounts"
    );
    assert_eq!(
        clean[26..31],
        ["(t,3,t)", "false", "(t,2,t)", "(t,2,t)", "(t,1,t)"],
        "the adaptive limit cut by a drop, a slow call and a timeout; the made-up lease refused"
    );
    assert_eq!(
        clean[31], "(t,990,metered)",
        "a reservation over two policies settled: 5 and 10 tokens used"
    );

    // a fresh backend: its first calls prepare every plan under the attacker's search_path
    let mut attacker = db.connect();
    attacker
        .batch_execute("SET ROLE rl_attacker")
        .expect("set role");
    attacker.batch_execute(ATTACK).expect("create look-alikes");
    attacker
        .batch_execute("SET search_path = evil, pg_catalog, public")
        .expect("search_path");
    let hijacked = scenario(&mut attacker, "c2");
    let clean_again = scenario(&mut db.connect(), "c3");
    assert_eq!(clean_again, clean, "two clean sessions agree");
    assert_eq!(hijacked, clean, "the look-alikes changed nothing");

    // the same backend handed to another client (transaction pooling): nothing it cached is poisoned
    attacker
        .batch_execute("RESET ROLE; RESET search_path")
        .expect("reset");
    let pooled = scenario(&mut attacker, "c4");
    assert_eq!(pooled, clean);
    let count = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).expect(sql).get(0) };
    assert_eq!(
        count(&mut owner, "SELECT count(*) FROM evil.bucket_state"),
        0
    );
    assert_eq!(
        count(
            &mut owner,
            "SELECT count(*) FROM rate_limit.policies WHERE burst > 1 AND name LIKE 'strict%'"
        ),
        0
    );
    owner
        .batch_execute("DROP SCHEMA evil CASCADE; DROP ROLE rl_attacker")
        .expect("clean up");
}
