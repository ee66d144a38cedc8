//! Per-key overrides on a real server: 16 connections hammering an overridden key, a plain key, an exempt
//! key and a denied key of one policy grant exactly what each is allowed, in both stores; a change made by
//! one session is used by another at its next transaction; a role with only LOGIN cannot set one (42501);
//! reading a policy and its overrides assigns no transaction id (so a hot standby can).

use std::sync::{Arc, Barrier};
use std::thread;

use postgres::error::SqlState;
use rate_limit_integration::{fresh_name, TestDb};

const CONNECTIONS: usize = 16;
const CALLS: usize = 12;

#[test]
fn sixteen_connections_get_exactly_each_keys_limit_in_both_stores() {
    let db = Arc::new(TestDb::new("overrides_hammer"));
    for store in ["table", "memory"] {
        let policy = fresh_name(&format!("ovr_{store}"));
        db.connect()
            .batch_execute(&format!(
                "SELECT rate_limit.create_policy('{policy}', 5, '1 day', store => '{store}');
                 SELECT rate_limit.set_override('{policy}', 'gold', rate => 40, burst => 40);
                 SELECT rate_limit.set_override('{policy}', 'vip', action => 'exempt');
                 SELECT rate_limit.set_override('{policy}', 'bad', action => 'deny')"
            ))
            .expect("policy and overrides");
        let keys = ["gold", "plain", "vip", "bad"];
        let start = Arc::new(Barrier::new(CONNECTIONS));
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let (db, start, policy) = (db.clone(), start.clone(), policy.clone());
                thread::spawn(move || {
                    let mut c = db.connect();
                    let mut granted = [0usize; 4];
                    start.wait();
                    for _ in 0..CALLS {
                        for (i, key) in keys.iter().enumerate() {
                            let allowed: bool = c
                                .query_one(
                                    "SELECT allowed FROM rate_limit.take($1, $2)",
                                    &[&policy, key],
                                )
                                .expect("take")
                                .get(0);
                            granted[i] += usize::from(allowed);
                        }
                    }
                    granted
                })
            })
            .collect();
        let mut total = [0usize; 4];
        for w in workers {
            let g = w.join().expect("a worker");
            for i in 0..4 {
                total[i] += g[i];
            }
        }
        // 40 and 5 tokens a day: nothing refills within the test (at most one token in 36 min)
        assert_eq!(total, [40, 5, CONNECTIONS * CALLS, 0], "{store}");
    }
}

#[test]
fn a_change_is_used_by_every_other_session_at_its_next_transaction() {
    let db = TestDb::new("overrides_coherence");
    let mut owner = db.connect();
    let mut other = db.connect();
    owner
        .batch_execute("SELECT rate_limit.create_policy('coherent', 1, '1 day')")
        .expect("policy");
    let take = |c: &mut postgres::Client| -> bool {
        c.query_one("SELECT allowed FROM rate_limit.take('coherent', 'k')", &[])
            .expect("take")
            .get(0)
    };
    assert!(take(&mut other));
    assert!(!take(&mut other)); // the policy (and that it has no overrides) is cached now
    owner
        .batch_execute("SELECT rate_limit.set_override('coherent', 'k', action => 'exempt')")
        .expect("exempt");
    assert!(take(&mut other));
    assert!(take(&mut other));
    owner
        .batch_execute("SELECT rate_limit.set_override('coherent', 'k', action => 'deny')")
        .expect("deny");
    assert!(!take(&mut other));
    owner
        .batch_execute("SELECT rate_limit.clear_override('coherent', 'k')")
        .expect("clear");
    assert!(!take(&mut other)); // its bucket is still empty
    owner
        .batch_execute("SELECT rate_limit.set_override('coherent', 'k', burst => 3)")
        .expect("a larger burst");
    // the empty bucket carries over (no token gained); a new key gets the override's burst
    assert!(!take(&mut other));
    owner
        .batch_execute("SELECT rate_limit.set_override('coherent', 'fresh', burst => 3)")
        .expect("a new key");
    let fresh: i64 = other
        .query_one(
            "SELECT count(*) FROM generate_series(1, 5) AS g, \
             LATERAL rate_limit.take('coherent', 'fresh' || left(g::text, 0)) AS d WHERE d.allowed",
            &[],
        )
        .expect("takes")
        .get(0);
    assert_eq!(fresh, 3);
}

#[test]
fn a_role_with_only_login_cannot_set_clear_or_list_overrides() {
    let db = TestDb::new("overrides_roles");
    db.connect()
        .batch_execute(
            "SELECT rate_limit.create_policy('guarded', 1, '1 day');
             SELECT rate_limit.set_override('guarded', 'k', action => 'exempt')",
        )
        .expect("policy");
    let mut role = db.connect_as_login_role("rl_it_override_nobody");
    for query in [
        "SELECT rate_limit.set_override('guarded', 'mine', action => 'exempt')",
        "SELECT rate_limit.clear_override('guarded', 'k')",
        "SELECT count(*) FROM rate_limit.overrides",
        "DELETE FROM rate_limit.key_overrides",
    ] {
        let e = role.batch_execute(query).expect_err(query);
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{query}");
    }
    let allowed: bool = role
        .query_one(
            "SELECT allowed FROM rate_limit.take('guarded', 'mine')",
            &[],
        )
        .expect("take")
        .get(0);
    assert!(allowed);
    let allowed: bool = role
        .query_one(
            "SELECT allowed FROM rate_limit.take('guarded', 'mine')",
            &[],
        )
        .expect("take")
        .get(0);
    assert!(!allowed, "the role's own key follows the policy");
}

/// A backend's first call of a policy with overrides reads them without a transaction id: a hot standby,
/// which cannot assign one, limits with its memory store too (tests/failover.rs calls one there).
#[test]
fn reading_a_policys_overrides_assigns_no_transaction_id() {
    let db = TestDb::new("overrides_read_only");
    db.connect()
        .batch_execute(
            "SELECT rate_limit.create_policy('read_only', 1, '1 hour', store => 'memory');
             SELECT rate_limit.set_override('read_only', 'k', burst => 2)",
        )
        .expect("policy");
    let mut c = db.connect();
    let mut t = c
        .build_transaction()
        .read_only(true)
        .start()
        .expect("read only");
    let allowed: bool = t
        .query_one("SELECT allowed FROM rate_limit.take('read_only', 'k')", &[])
        .expect("take")
        .get(0);
    assert!(allowed);
    let xid: Option<i64> = t
        .query_one("SELECT txid_current_if_assigned()", &[])
        .expect("xid")
        .get(0);
    assert_eq!(xid, None);
}
