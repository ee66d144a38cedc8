//! Calls a role with only LOGIN can make wrongly, each answered with a SQLSTATE of the right class and never
//! XX000 (a Rust panic), NULL or a silent "everything":
//! - the trigger functions `rate_limit.limit_writes()` and `rate_limit.policies_changed()` called as plain
//!   functions: 39P01, as PostgreSQL's own trigger functions answer (before: XX000 "NotTrigger");
//!   `policies_changed` is the owner's: another role may neither call it nor attach it to a table of its
//!   own (42501), so it cannot make other backends forget their caches at every commit of its own, and
//!   attached to any other table by a superuser it refuses to fire (42501);
//! - `create_policy`/`alter_policy` with `options` nested 128 deep or holding `1e400`: 22023 (before:
//!   XX000 from the JSON library); `nodes_of('{}')` without Citus: 0A000 (before: 42P01);
//! - arguments of a megabyte quoted in errors: cut to 64 characters with their length said, in the
//!   message the client reads and in the server log (before: whole);
//! - `rate_limit.headers(NULL)`: 22004, like every other function (before: NULL);
//! - `rate_limit.reset_stats(NULL)`: 22004 (before: it reset every statistic); `reset_stats()` resets all;
//! - `rate_limit.headers(d, label)` for an ad-hoc decision: the label only names the fields, whose numbers
//!   are the decision's (before: the numbers of the policy the label happened to name).
//! - `rate_limit.dropped_policies` and the trigger that writes it: 42501 for every other role;
//! - `rate_limit.distribute()`: 42501 for every other role (0A000 for the owner without Citus);
//! - the settings that bound or lift limits (`rate_limit.shadow`, `max_refill_time`, `max_wait`,
//!   `max_policy_refill_time`): 42501 in the compiled edition; in the portable edition, where each name is
//!   a placeholder any session may set, setting them lifts nothing.

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use rate_limit_integration::{compiled_only, conninfo, edition, stores, Edition, TestDb};

fn code_of(client: &mut Client, sql: &str) -> SqlState {
    let e = client.batch_execute(sql).expect_err(sql);
    let db_error = e
        .as_db_error()
        .unwrap_or_else(|| panic!("{sql}: not a server error: {e:?}"));
    assert!(
        !db_error.message().contains("panic"),
        "{sql}: {}",
        db_error.message()
    );
    db_error.code().clone()
}

/// A role with only LOGIN (created afresh) and a connection to `db` as that role.
fn login_role(db: &TestDb, admin: &mut Client, role: &str) -> Client {
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN"
        ))
        .expect("role");
    Client::connect(
        &format!("{} dbname={} user={role}", conninfo(), db.name()),
        NoTls,
    )
    .expect("connect as the role")
}

#[test]
fn trigger_functions_called_directly_raise_39p01() {
    if compiled_only("trigger functions that refuse a direct call themselves (PostgreSQL refuses a PL/pgSQL one with 0A000)") {
        return;
    }
    let db = TestDb::new("misuse_triggers");
    let mut admin = db.connect();
    let mut role = login_role(&db, &mut admin, "rl_misuse");
    for client in [&mut admin, &mut role] {
        assert_eq!(
            code_of(client, "SELECT rate_limit.limit_writes()"),
            SqlState::E_R_I_E_TRIGGER_PROTOCOL_VIOLATED
        );
    }
    assert_eq!(
        code_of(&mut admin, "SELECT rate_limit.policies_changed()"),
        SqlState::E_R_I_E_TRIGGER_PROTOCOL_VIOLATED
    );
    assert_eq!(
        code_of(&mut role, "SELECT rate_limit.policies_changed()"),
        SqlState::INSUFFICIENT_PRIVILEGE
    );
    // and as triggers they still work
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('two_rows', 2, '1 hour');
             CREATE TABLE t (k text);
             CREATE TRIGGER limited BEFORE INSERT ON t
                 FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('two_rows', 'k');
             INSERT INTO t VALUES ('a'), ('a');",
        )
        .expect("the trigger and the policy trigger fire");
    assert_eq!(
        code_of(&mut admin, "INSERT INTO t VALUES ('a')"),
        SqlState::CONFIGURATION_LIMIT_EXCEEDED
    );
}

/// What a role with only LOGIN made every backend of the database do before: attach the extension's own
/// trigger function to a temporary table of its own, so that each of its commits made every other backend
/// empty its policy cache. Now it may not attach it (42501), nor may anyone make it fire on another table:
/// another backend keeps its cached policy across the role's commits (the cache's reads are counted).
#[test]
fn no_other_role_can_make_backends_forget_their_policies() {
    if compiled_only("the policy cache and its trigger") {
        return;
    }
    let db = TestDb::new("misuse_flush");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT rate_limit.create_policy('cached', 100, '1 second', 100)")
        .expect("policy");
    let mut role = login_role(&db, &mut admin, "rl_misuse_f");
    role.batch_execute("CREATE TEMP TABLE mine (k int)")
        .expect("a table of its own");
    for sql in [
        "CREATE TRIGGER flush AFTER INSERT ON pg_temp.mine \
         FOR EACH STATEMENT EXECUTE FUNCTION rate_limit.policies_changed()",
        "CREATE TRIGGER flush AFTER INSERT ON pg_temp.mine \
         FOR EACH ROW EXECUTE FUNCTION rate_limit.policies_changed()",
    ] {
        assert_eq!(
            code_of(&mut role, sql),
            SqlState::INSUFFICIENT_PRIVILEGE,
            "{sql}"
        );
    }
    // a superuser who attaches it anyway gets a trigger that refuses to fire
    admin
        .batch_execute(
            "CREATE TABLE not_ours (k int);
             CREATE TRIGGER flush AFTER INSERT ON not_ours
                 FOR EACH STATEMENT EXECUTE FUNCTION rate_limit.policies_changed()",
        )
        .expect("a superuser may attach it");
    assert_eq!(
        code_of(&mut admin, "INSERT INTO not_ours VALUES (1)"),
        SqlState::INSUFFICIENT_PRIVILEGE
    );
    // the role's commits leave another backend's cached policy alone: its takes read no policy row (the
    // scans of rate_limit.policies and its index in each take's own transaction)
    let mut other = db.connect();
    let take_reads = |c: &mut Client| -> i64 {
        // a backend's statistics are its pending counts until it flushes them, which it does only between
        // transactions: the difference within one transaction is its take's
        let scans = "SELECT pg_catalog.pg_stat_get_xact_numscans('rate_limit.policies'::regclass) \
                       + pg_catalog.pg_stat_get_xact_numscans('rate_limit.policies_pkey'::regclass)";
        let mut tx = c.transaction().expect("begin");
        let before: i64 = tx.query_one(scans, &[]).expect("scans").get(0);
        tx.execute("SELECT rate_limit.take('cached', 'k')", &[])
            .expect("take");
        let after: i64 = tx.query_one(scans, &[]).expect("scans").get(0);
        tx.commit().expect("commit");
        after - before
    };
    assert!(
        take_reads(&mut other) > 0,
        "the first take reads the policy"
    );
    // (a read during which any invalidation arrived is used but not kept: the next one is)
    let warm = (0..5).any(|_| take_reads(&mut other) == 0);
    assert!(warm, "the policy is kept in this backend's cache");
    for _ in 0..20 {
        let _ = role.batch_execute("INSERT INTO pg_temp.mine VALUES (1)");
        assert_eq!(take_reads(&mut other), 0, "the cache was emptied");
    }
}

/// Bad input that used to reach a library's panic, or the wrong SQLSTATE: `options` nested deeper than
/// any option takes, or holding a number beyond a double (the owner's functions), 22023; `nodes_of` of no
/// keys without Citus, 0A000 as for any keys (a role with only LOGIN).
#[test]
fn options_too_deep_or_too_large_and_nodes_of_no_keys_get_their_sqlstates() {
    let db = TestDb::new("misuse_input");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT rate_limit.create_policy('opts', 1, '1 minute')")
        .expect("policy");
    let deep = format!("{}1{}", "[".repeat(128), "]".repeat(128));
    for options in [
        format!(r#"{{"description": {deep}}}"#),
        deep.clone(),
        r#"{"description": 1e400}"#.to_string(),
        "1e400".to_string(),
    ] {
        for sql in [
            format!(
                "SELECT rate_limit.create_policy('opts2', 1, '1 minute', options => '{options}')"
            ),
            format!("SELECT rate_limit.alter_policy('opts', options => '{options}')"),
        ] {
            assert_eq!(
                code_of(&mut admin, &sql),
                SqlState::INVALID_PARAMETER_VALUE,
                "{}",
                &sql[..80]
            );
        }
    }
    if compiled_only("rate_limit.nodes_of, for Citus") {
        return;
    }
    let mut role = login_role(&db, &mut admin, "rl_misuse_n");
    for sql in [
        "SELECT * FROM rate_limit.nodes_of('{}')",
        "SELECT * FROM rate_limit.nodes_of(ARRAY['k'])",
    ] {
        assert_eq!(
            code_of(&mut role, sql),
            SqlState::FEATURE_NOT_SUPPORTED,
            "{sql}"
        );
    }
}

/// A megabyte argument is quoted in an error cut to its first 64 characters, with its length: in the
/// message the client reads, and so in the server log.
#[test]
fn long_arguments_are_cut_in_errors() {
    let db = TestDb::new("misuse_long");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT rate_limit.create_policy('lp', 1, '1 minute')")
        .expect("policy");
    let mut role = login_role(&db, &mut admin, "rl_misuse_l");
    let long = "p".repeat(1 << 20);
    let cut = format!("\"{}…\" (1048576 bytes)", "p".repeat(64));
    // (true: as the role with only LOGIN; false: as the owner)
    for (as_role, sql, state) in [
        (true, "SELECT rate_limit.take($1, 'k')", SqlState::UNDEFINED_OBJECT),
        (true, "SELECT rate_limit.take_many(ARRAY['lp', 'lp'], ARRAY[$1])", SqlState::INVALID_PARAMETER_VALUE),
        (false, "SELECT rate_limit.create_policy($1, 1, '1 minute')", SqlState::INVALID_PARAMETER_VALUE),
        (false, "SELECT rate_limit.create_policy('lq', 1, '1 minute', algorithm => $1)", SqlState::INVALID_PARAMETER_VALUE),
        (false, "SELECT rate_limit.create_policy('lq', 1, '1 month', algorithm => 'calendar_window', time_zone => $1)", SqlState::INVALID_PARAMETER_VALUE),
        (false, "SELECT rate_limit.set_override('lp', 'k', action => $1)", SqlState::INVALID_PARAMETER_VALUE),
    ] {
        let client = if as_role { &mut role } else { &mut admin };
        // (a key is at most 2048 bytes: the longest one take_many may quote)
        let argument = if sql.contains("take_many") { "k".repeat(2048) } else { long.clone() };
        let e = client.execute(sql, &[&argument]).expect_err(sql);
        let db_error = e.as_db_error().expect("a server error");
        assert_eq!(db_error.code(), &state, "{sql}");
        assert!(
            db_error.message().len() < 400,
            "{sql}: a message of {} bytes",
            db_error.message().len()
        );
        if !sql.contains("take_many") {
            assert!(db_error.message().contains(&cut), "{sql}: {}", db_error.message());
        }
    }
}

#[test]
fn null_arguments_of_headers_and_reset_stats_raise_22004() {
    let db = TestDb::new("misuse_nulls");
    let mut c = db.connect();
    c.batch_execute("SELECT rate_limit.create_policy('api', 10, '1 minute', 5)")
        .expect("policy");
    assert_eq!(
        code_of(&mut c, "SELECT rate_limit.headers(NULL)"),
        SqlState::NULL_VALUE_NOT_ALLOWED
    );
    assert_eq!(
        code_of(&mut c, "SELECT rate_limit.headers(NULL, 'api')"),
        SqlState::NULL_VALUE_NOT_ALLOWED
    );
    // statistics: a NULL policy is an error, not "everything"
    if compiled_only("the statistics") {
        return;
    }
    c.batch_execute("SELECT rate_limit.take('api', 'k')")
        .expect("take");
    let calls = |c: &mut Client| -> i64 {
        c.query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM rate_limit.stats",
            &[],
        )
        .expect("stats")
        .get(0)
    };
    assert_eq!(calls(&mut c), 1);
    assert_eq!(
        code_of(&mut c, "SELECT rate_limit.reset_stats(NULL)"),
        SqlState::NULL_VALUE_NOT_ALLOWED
    );
    assert_eq!(calls(&mut c), 1, "reset_stats(NULL) reset statistics");
    let reset: i64 = c
        .query_one("SELECT rate_limit.reset_stats()", &[])
        .expect("reset all")
        .get(0);
    assert_eq!(reset, 1);
    assert_eq!(calls(&mut c), 0);
}

#[test]
fn a_label_names_the_headers_of_an_ad_hoc_decision_without_lending_its_numbers() {
    let db = TestDb::new("misuse_label");
    let mut c = db.connect();
    c.batch_execute("SELECT rate_limit.create_policy('api', 10, '1 minute', 5)")
        .expect("policy");
    let row = c
        .query_one(
            "SELECT h ->> 'RateLimit', h ? 'RateLimit-Policy' \
             FROM rate_limit.take_ad_hoc('k', 100, '1 hour') AS d, rate_limit.headers(d, 'api') AS h",
            &[],
        )
        .expect("headers");
    assert_eq!(row.get::<_, String>(0), "\"api\";r=99;t=36");
    assert!(
        !row.get::<_, bool>(1),
        "the numbers of policy api (q=5) are not this decision's"
    );
    // a named decision keeps its own numbers under any label
    let policy: String = c
        .query_one(
            "SELECT rate_limit.headers(d, 'shown') ->> 'RateLimit-Policy' \
             FROM rate_limit.take('api', 'k') AS d",
            &[],
        )
        .expect("headers")
        .get(0);
    assert_eq!(policy, "\"shown\";q=5;w=30");
}

/// The record of dropped policies is the owner's: a role with only LOGIN can neither read nor write it,
/// nor run the trigger that writes it (42501); called directly by the owner, that trigger function is
/// refused as PL/pgSQL refuses any trigger function (0A000).
#[test]
fn the_dropped_policies_record_is_closed_to_other_roles() {
    if compiled_only("the memory store's record of dropped policies") {
        return;
    }
    let db = TestDb::new("misuse_dropped");
    let mut admin = db.connect();
    let mut role = login_role(&db, &mut admin, "rl_misuse_d");
    for sql in [
        "SELECT * FROM rate_limit.dropped_policies",
        "INSERT INTO rate_limit.dropped_policies VALUES ('p', now())",
        "DELETE FROM rate_limit.dropped_policies",
        "SELECT rate_limit.policies_dropped()",
        "DELETE FROM rate_limit.policies",
        "TRUNCATE rate_limit.policies",
    ] {
        assert_eq!(
            code_of(&mut role, sql),
            SqlState::INSUFFICIENT_PRIVILEGE,
            "{sql}"
        );
    }
    assert_eq!(
        code_of(&mut admin, "SELECT rate_limit.policies_dropped()"),
        SqlState::FEATURE_NOT_SUPPORTED
    );
}

/// `rate_limit.distribute()` reshapes the extension's tables for Citus: a role with only LOGIN may not call
/// it (42501), even where Citus is absent.
#[test]
fn distribute_is_closed_to_other_roles() {
    if compiled_only("Citus") {
        return;
    }
    let db = TestDb::new("misuse_distribute");
    let mut admin = db.connect();
    let mut role = login_role(&db, &mut admin, "rl_misuse_c");
    let sql = "SELECT * FROM rate_limit.distribute()";
    assert_eq!(code_of(&mut role, sql), SqlState::INSUFFICIENT_PRIVILEGE);
    assert_eq!(code_of(&mut admin, sql), SqlState::FEATURE_NOT_SUPPORTED);
}

/// No Rust backtrace ever reaches a client, although `scripts/test.sh` starts this server with
/// `RUST_BACKTRACE=1` in its environment (PostgreSQL overwrites a process's environment block with its
/// title, so SQL cannot check that; the code under test cannot tell either): a wait cut short by
/// statement_timeout, and a PostgreSQL error raised inside the extension's own queries (an owner function in a READ
/// ONLY transaction), each keep their SQLSTATE, and their message, detail and hint hold no stack frame
/// (before: about 50 of 12,600 fuzzed errors carried one in their DETAIL).
#[test]
fn no_backtrace_reaches_a_client() {
    if compiled_only("the library's Rust code") {
        return;
    }
    let db = TestDb::new("misuse_backtrace");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT rate_limit.create_policy('bt_slow', 1, '20 seconds', 1)")
        .expect("policy");
    for store in stores() {
        let mut c = db.connect();
        c.batch_execute(&format!("SET rate_limit.store = '{store}'"))
            .expect("store");
        c.query_one("SELECT allowed FROM rate_limit.take('bt_slow', 'k')", &[])
            .expect("drain");
        c.batch_execute("SET statement_timeout = '200ms'")
            .expect("timeout");
        let mut cases = vec![
            (
                "SELECT rate_limit.wait('bt_slow', 'k')",
                SqlState::QUERY_CANCELED,
            ),
            (
                "BEGIN READ ONLY; SELECT rate_limit.create_policy('bt_ro', 1, '1 second')",
                SqlState::READ_ONLY_SQL_TRANSACTION,
            ),
        ];
        if store == "table" {
            // the memory store resets in a read-only transaction
            cases.push((
                "BEGIN READ ONLY; SELECT rate_limit.reset('bt_slow', 'k')",
                SqlState::READ_ONLY_SQL_TRANSACTION,
            ));
        }
        for (sql, code) in cases {
            let e = c.batch_execute(sql).expect_err(sql);
            let _ = c.batch_execute("ROLLBACK");
            let db_error = e
                .as_db_error()
                .unwrap_or_else(|| panic!("{sql}: not a server error: {e:?}"));
            assert_eq!(db_error.code(), &code, "{store}: {sql}: {db_error:?}");
            for text in [Some(db_error.message()), db_error.detail(), db_error.hint()]
                .into_iter()
                .flatten()
            {
                assert!(
                    !text.contains("backtrace") && !text.contains("\n   0: "),
                    "{store}: {sql}: a stack reached the client: {text}"
                );
            }
        }
    }
}

/// The settings a role would set to lift its own limits. The compiled edition defines them as superuser
/// settings (42501). Without the library each name is a placeholder any session may set: the portable
/// edition reads none of them where a call of PUBLIC's is decided, so a role that sets them all is still
/// denied on a drained bucket, refused a limit slower than the bound (22023), and given up on by `wait`
/// at once when the token is further away than the owner's `max_wait()`.
#[test]
fn settings_a_role_may_set_lift_none_of_its_limits() {
    let db = TestDb::new("placeholder_settings");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT rate_limit.create_policy('slow', 1, '40 seconds', 1)")
        .expect("policy");
    let mut role = login_role(&db, &mut admin, "rl_placeholder_role");
    let settings = [
        "SET rate_limit.shadow = on",
        "SET rate_limit.max_refill_time = '36500d'",
        "SET rate_limit.max_wait = '1h'",
        "SET rate_limit.max_policy_refill_time = '36500d'",
    ];
    for set in settings {
        match edition() {
            Edition::Compiled => {
                assert_eq!(
                    code_of(&mut role, set),
                    SqlState::INSUFFICIENT_PRIVILEGE,
                    "{set}"
                )
            }
            Edition::Portable => role.batch_execute(set).expect(set),
        }
    }
    let allowed = |c: &mut Client| -> bool {
        c.query_one("SELECT allowed FROM rate_limit.take('slow', 'k')", &[])
            .expect("take")
            .get(0)
    };
    assert!(allowed(&mut role));
    assert!(!allowed(&mut role), "denied, whatever the session set");
    assert_eq!(
        code_of(&mut role, "SELECT rate_limiting_request('far', 1, 86401)"),
        SqlState::INVALID_PARAMETER_VALUE
    );
    assert_eq!(
        code_of(
            &mut role,
            "SELECT rate_limit.take_ad_hoc('far', 1, '36500000 days')"
        ),
        SqlState::INVALID_PARAMETER_VALUE
    );
    // a wait past the 30 s of max_wait is refused, whatever the session set it to
    assert_eq!(
        code_of(
            &mut role,
            "SELECT rate_limit.wait('slow', 'k', 1, '1 minute')"
        ),
        SqlState::INVALID_PARAMETER_VALUE
    );
    // the next token is about 40 s away, past any timeout a wait accepts: wait gives up at once
    let started = std::time::Instant::now();
    let waited: bool = role
        .query_one(
            "SELECT allowed FROM rate_limit.wait('slow', 'k', 1, '30 seconds')",
            &[],
        )
        .expect("wait")
        .get(0);
    assert!(!waited, "no grant within max_wait");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "wait slept {:?}",
        started.elapsed()
    );
    assert_eq!(
        code_of(
            &mut role,
            "SELECT rate_limit.create_policy('mine', 1, '1000 days')"
        ),
        SqlState::INSUFFICIENT_PRIVILEGE
    );
    drop(role);
    let _ = admin.batch_execute("DROP ROLE rl_placeholder_role");
}
