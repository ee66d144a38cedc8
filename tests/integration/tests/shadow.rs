//! Shadow mode against a real server, from many connections: a policy in shadow mode denies nobody, takes
//! exactly the tokens it has, and counts every would-be denial; next to an enforced policy it never
//! changes what the enforced one grants; `rate_limit.shadow` is the server-wide switch, which no ordinary
//! role can set for itself.

use std::thread;

use postgres::error::SqlState;
use postgres::Client;
use rate_limit_integration::{compiled_only, edition, remaining, Edition, TestDb};

const THREADS: usize = 8;
const CALLS: usize = 40;

/// Runs `sql` (returning `allowed, shadow_denied`) `CALLS` times on each of `THREADS` connections at
/// once; returns (allowed, shadow_denied) counts.
fn hammer(db: &TestDb, store: &str, sql: &'static str) -> (i64, i64) {
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut c = db.connect();
            c.execute(
                "SELECT pg_catalog.set_config('rate_limit.store', $1, false)",
                &[&store],
            )
            .expect("choose the store");
            thread::spawn(move || {
                let (mut allowed, mut shadowed) = (0i64, 0i64);
                for _ in 0..CALLS {
                    let row = c.query_one(sql, &[]).expect("take");
                    allowed += i64::from(row.get::<_, bool>(0));
                    shadowed += i64::from(row.get::<_, bool>(1));
                }
                (allowed, shadowed)
            })
        })
        .collect();
    handles.into_iter().fold((0, 0), |(a, s), h| {
        let (a2, s2) = h.join().expect("client thread");
        (a + a2, s + s2)
    })
}

fn stats(c: &mut Client, policy: &str) -> (i64, i64, i64) {
    let row = c
        .query_one(
            "SELECT calls, granted, denied FROM rate_limit.stats WHERE policy = $1",
            &[&policy],
        )
        .expect("stats");
    (row.get(0), row.get(1), row.get(2))
}

/// A shadow policy with 25 tokens (one a day) on one key, 320 calls at once: every call is allowed,
/// exactly 25 were granted tokens and 295 report `shadow_denied`, and the statistics say the same.
fn shadow_policy_denies_nobody_and_counts_exactly(store: &str) {
    let db = TestDb::new(&format!("shadow_{store}"));
    let mut admin = db.connect();
    admin
        .execute(
            "SELECT rate_limit.create_policy('trial', 1, '1 day', burst => 25, shadow => true, store => $1)",
            &[&store],
        )
        .expect("create policy");
    let total = (THREADS * CALLS) as i64;
    let (allowed, shadowed) = hammer(
        &db,
        store,
        "SELECT allowed, shadow_denied FROM rate_limit.take('trial', 'k')",
    );
    assert_eq!(allowed, total, "shadow mode denies nobody");
    assert_eq!(
        shadowed,
        total - 25,
        "every call beyond the 25 tokens is reported"
    );
    assert_eq!(remaining(&mut admin, "trial", "k"), 0);
    if edition() == Edition::Compiled {
        assert_eq!(stats(&mut admin, "trial"), (total, 25, total - 25));
    }
}

#[test]
fn shadow_policy_denies_nobody_and_counts_exactly_in_the_table_store() {
    shadow_policy_denies_nobody_and_counts_exactly("table");
}

#[test]
fn shadow_policy_denies_nobody_and_counts_exactly_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    shadow_policy_denies_nobody_and_counts_exactly("memory");
}

/// An enforced policy (burst 30) and a shadow one (burst 10) in one call, from 8 connections: the enforced
/// one grants exactly its 30, as it would alone; the shadow one gave its 10 tokens and reported the rest
/// of those 30 calls; calls the enforced one denied took nothing from either.
fn shadow_beside_an_enforced_policy(store: &str) {
    let db = TestDb::new(&format!("shadow_beside_{store}"));
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "SELECT rate_limit.create_policy('live', 1, '1 day', burst => 30, store => '{store}');
             SELECT rate_limit.create_policy('trial', 1, '1 day', burst => 10, shadow => true, store => '{store}');"
        ))
        .expect("create policies");
    let (allowed, shadowed) = hammer(
        &db,
        store,
        "SELECT allowed, shadow_denied FROM rate_limit.take_many(ARRAY['live', 'trial'], ARRAY['k'])",
    );
    assert_eq!(allowed, 30, "the enforced policy alone decides");
    assert_eq!(
        shadowed, 20,
        "the shadow policy's 10 tokens went to the first grants"
    );
    assert_eq!(remaining(&mut admin, "live", "k"), 0);
    assert_eq!(remaining(&mut admin, "trial", "k"), 0);
    if edition() == Edition::Portable {
        return; // the statistics are the compiled edition's
    }
    let total = (THREADS * CALLS) as i64;
    assert_eq!(stats(&mut admin, "live"), (total, 30, total - 30));
    // the shadow policy was asked in every call; it granted 10 and refused at least the 20 reported
    let (calls, granted, denied) = stats(&mut admin, "trial");
    assert_eq!((calls, granted), (total, 10));
    assert!(denied >= 20, "{denied} would-be denials counted");
}

#[test]
fn shadow_beside_an_enforced_policy_in_the_table_store() {
    shadow_beside_an_enforced_policy("table");
}

#[test]
fn shadow_beside_an_enforced_policy_in_the_memory_store() {
    if compiled_only("the memory store") {
        return;
    }
    shadow_beside_an_enforced_policy("memory");
}

/// `rate_limit.shadow` is superuser-only: an ordinary role gets 42501 when it tries to set it, so it cannot
/// lift its own limits. Set for its database by a superuser, it lets every call of every session through,
/// and a policy switched out of shadow mode with `alter_policy` is enforced in the other sessions at once.
#[test]
fn the_switch_is_for_superusers_and_alter_policy_is_live() {
    if compiled_only("rate_limit.shadow, the server-wide switch") {
        return;
    }
    let db = TestDb::new("shadow_switch");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT rate_limit.create_policy('strict', 1, '1 day');
             DROP ROLE IF EXISTS rl_shadow_seeker; CREATE ROLE rl_shadow_seeker;",
        )
        .expect("set up");
    let mut app = db.connect();
    app.batch_execute("SET ROLE rl_shadow_seeker")
        .expect("become the role");
    let e = app
        .batch_execute("SET rate_limit.shadow = on")
        .expect_err("an ordinary role must not set rate_limit.shadow");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
    let allowed = |c: &mut Client| -> bool {
        c.query_one("SELECT allowed FROM rate_limit.take('strict', 'k')", &[])
            .expect("take")
            .get(0)
    };
    assert!(allowed(&mut app));
    assert!(!allowed(&mut app));
    admin
        .batch_execute("ALTER DATABASE rl_it_shadow_switch SET rate_limit.shadow = on")
        .expect("the switch");
    let mut later = db.connect();
    later
        .batch_execute("SET ROLE rl_shadow_seeker")
        .expect("become the role");
    assert!(allowed(&mut later), "the switch lets every call through");
    admin
        .batch_execute(
            "ALTER DATABASE rl_it_shadow_switch RESET rate_limit.shadow;
             SELECT rate_limit.alter_policy('strict', shadow => true);",
        )
        .expect("per policy instead");
    assert!(
        allowed(&mut app),
        "the policy is in shadow mode for a session that was already open"
    );
    admin
        .batch_execute("SELECT rate_limit.alter_policy('strict', shadow => false)")
        .expect("enforce");
    assert!(!allowed(&mut app), "and enforced again at its next call");
    drop((app, later));
    let _ = admin.batch_execute("DROP ROLE rl_shadow_seeker");
}

/// A policy switched in and out of shadow mode with `alter_policy` changes at the next call of a session
/// that was already open, in both editions.
#[test]
fn alter_policy_switches_shadow_mode_live() {
    let db = TestDb::new("shadow_live");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT rate_limit.create_policy('strict', 1, '1 day')")
        .expect("set up");
    let mut app = db.connect();
    let allowed = |c: &mut Client| -> bool {
        c.query_one("SELECT allowed FROM rate_limit.take('strict', 'k')", &[])
            .expect("take")
            .get(0)
    };
    assert!(allowed(&mut app));
    assert!(!allowed(&mut app));
    admin
        .batch_execute("SELECT rate_limit.alter_policy('strict', shadow => true)")
        .expect("shadow mode");
    assert!(
        allowed(&mut app),
        "in shadow mode for a session already open"
    );
    admin
        .batch_execute("SELECT rate_limit.alter_policy('strict', shadow => false)")
        .expect("enforce");
    assert!(!allowed(&mut app), "and enforced again at its next call");
}
