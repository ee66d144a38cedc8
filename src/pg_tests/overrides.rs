//! Per-key overrides: a key's own numbers, a denied or exempt key, in both stores; tokens carried over when
//! a key's numbers change; the end of an override; what is refused (by SQLSTATE); a policy without
//! overrides reads none; a dropped policy's overrides go with it.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

    /// Whether each of `n` takes of `key` under `policy` was granted, in order.
    fn takes(policy: &str, key: &str, n: usize) -> Vec<bool> {
        (0..n)
            .map(|_| {
                Spi::get_one::<bool>(&format!(
                    "SELECT allowed FROM rate_limit.take('{policy}', '{key}')"
                ))
                .expect("take")
                .expect("a decision")
            })
            .collect()
    }

    fn granted(policy: &str, key: &str, n: usize) -> usize {
        takes(policy, key, n).into_iter().filter(|&a| a).count()
    }

    fn state(query: &str) -> Option<String> {
        error_of(query).map(|e| e[..5].to_string())
    }

    #[pg_test]
    fn a_key_gets_its_own_numbers_or_answer_in_both_stores() {
        for store in ["table", "memory"] {
            let p = format!("pt_ovr_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 2, '1 hour', store => '{store}');
                 SELECT rate_limit.set_override('{p}', 'gold', rate => 5, burst => 5);
                 SELECT rate_limit.set_override('{p}', 'wide', burst => 3);
                 SELECT rate_limit.set_override('{p}', 'bad', action => 'deny');
                 SELECT rate_limit.set_override('{p}', 'vip', action => 'exempt')"
            ))
            .expect("policy and overrides");
            assert_eq!(granted(&p, "plain", 10), 2, "{store}: the policy's burst");
            assert_eq!(granted(&p, "gold", 10), 5, "{store}: its own burst");
            assert_eq!(
                granted(&p, "wide", 10),
                3,
                "{store}: its burst, the policy's rate"
            );
            assert_eq!(granted(&p, "bad", 10), 0, "{store}: denied");
            assert_eq!(granted(&p, "vip", 10), 10, "{store}: exempt");
            // a denied or exempt key's bucket is neither read nor written
            assert_eq!(
                int(&format!(
                    "SELECT count(*) FROM rate_limit.buckets WHERE policy = '{p}' AND key IN ('bad', 'vip')"
                )),
                0,
                "{store}"
            );
            // a denial without end says so: no retry_after
            assert_eq!(
                text(&format!(
                    "SELECT (retry_after IS NULL)::text || ' ' || remaining || ' ' || \"limit\" \
                     FROM rate_limit.take('{p}', 'bad')"
                ))
                .as_deref(),
                Some("true 0 2")
            );
            assert_eq!(
                text(&format!(
                    "SELECT allowed || ' ' || remaining || ' ' || \"limit\" FROM rate_limit.take('{p}', 'gold')"
                ))
                .as_deref(),
                Some("false 0 5")
            );
        }
    }

    /// An override's answer comes before a block: an exempt key that is blocked is granted, and its calls
    /// are not counted as blocked; a denied one is denied by the override, not counted as blocked either.
    #[pg_test]
    fn an_overrides_answer_comes_before_a_block() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_blocked', 5, '1 hour');
             SELECT rate_limit.block('pt_ovr_blocked', 'vip', '1 hour');
             SELECT rate_limit.block('pt_ovr_blocked', 'bad', '1 hour');
             SELECT rate_limit.set_override('pt_ovr_blocked', 'vip', action => 'exempt');
             SELECT rate_limit.set_override('pt_ovr_blocked', 'bad', action => 'deny')",
        )
        .expect("policy, blocks and overrides");
        assert_eq!(granted("pt_ovr_blocked", "vip", 3), 3);
        assert_eq!(granted("pt_ovr_blocked", "bad", 2), 0);
        let counted = crate::stats::rows("test")
            .expect("statistics")
            .into_iter()
            .find(|r| r.name == "pt_ovr_blocked")
            .map(|r| {
                (
                    r.totals.calls,
                    r.totals.granted,
                    r.totals.denied,
                    r.totals.blocked,
                )
            });
        assert_eq!(counted, Some((5, 3, 2, 0)));
    }

    #[pg_test]
    fn batches_and_multi_limit_calls_use_each_keys_override() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_batch', 1, '1 hour', store => 'memory');
             SELECT rate_limit.set_override('pt_ovr_batch', 'b', burst => 3);
             SELECT rate_limit.set_override('pt_ovr_batch', 'x', action => 'exempt')",
        )
        .expect("policy");
        let granted = int(
            "SELECT count(*) FROM rate_limit.take_batch('pt_ovr_batch', \
             ARRAY['a', 'a', 'b', 'b', 'b', 'b', 'x', 'x']) WHERE allowed",
        );
        assert_eq!(granted, 1 + 3 + 2);
        // take_many: an exempt key's policy never refuses the call
        assert_eq!(
            text(
                "SELECT allowed::text FROM rate_limit.take_many(ARRAY['pt_ovr_batch'], ARRAY['x'])"
            )
            .as_deref(),
            Some("true")
        );
    }

    #[pg_test]
    fn a_keys_tokens_carry_over_to_its_new_numbers_never_gaining_any() {
        Spi::run("SELECT rate_limit.create_policy('pt_ovr_carry', 2, '1 day')").expect("policy");
        assert_eq!(granted("pt_ovr_carry", "k", 3), 2);
        // a higher burst from now: the bucket keeps its 0 tokens, refilling at the new rate from now on
        Spi::run("SELECT rate_limit.set_override('pt_ovr_carry', 'k', rate => 4, burst => 4)")
            .expect("override");
        assert_eq!(granted("pt_ovr_carry", "k", 3), 0);
        // and a key never seen starts full under its override
        Spi::run("SELECT rate_limit.set_override('pt_ovr_carry', 'new', burst => 4)")
            .expect("override");
        assert_eq!(granted("pt_ovr_carry", "new", 5), 4);
    }

    #[pg_test]
    fn an_override_ends_when_it_says() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_end', 1, '1 hour');
             SELECT rate_limit.set_override('pt_ovr_end', 'k', action => 'deny',
                                            until => clock_timestamp() + interval '300 milliseconds')",
        )
        .expect("policy");
        let retry_ms = int(
            "SELECT (extract(epoch FROM retry_after) * 1000)::bigint FROM rate_limit.take('pt_ovr_end', 'k')",
        );
        assert!((1..=300).contains(&retry_ms), "{retry_ms}");
        Spi::run("SELECT pg_sleep(0.35)").expect("sleep");
        assert_eq!(
            takes("pt_ovr_end", "k", 2),
            vec![true, false],
            "the policy's numbers again"
        );
        assert_eq!(
            text("SELECT active::text FROM rate_limit.overrides WHERE policy = 'pt_ovr_end'")
                .as_deref(),
            Some("false")
        );
    }

    #[pg_test]
    fn clearing_an_override_puts_the_key_back_under_its_policy() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_clear', 1, '1 hour');
             SELECT rate_limit.set_override('pt_ovr_clear', 'k', action => 'exempt')",
        )
        .expect("policy");
        assert_eq!(granted("pt_ovr_clear", "k", 3), 3);
        assert_eq!(
            text("SELECT rate_limit.clear_override('pt_ovr_clear', 'k')::text").as_deref(),
            Some("true")
        );
        assert_eq!(
            text("SELECT rate_limit.clear_override('pt_ovr_clear', 'k')::text").as_deref(),
            Some("false")
        );
        assert_eq!(takes("pt_ovr_clear", "k", 2), vec![true, false]);
    }

    #[pg_test]
    fn a_policy_without_overrides_reads_none_and_one_with_them_reads_each_keys_own() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_none', 1, '1 hour');
             SELECT rate_limit.create_policy('pt_ovr_some', 1, '1 hour');
             SELECT rate_limit.set_override('pt_ovr_some', 'a', burst => 2);
             SELECT rate_limit.set_override('pt_ovr_some', 'b', action => 'deny')",
        )
        .expect("policies");
        let none = crate::policies::get("test", "pt_ovr_none").expect("policy");
        assert!(!crate::policies::overrides::any("test", &none).expect("any"));
        let some = crate::policies::get("test", "pt_ovr_some").expect("policy");
        assert!(crate::policies::overrides::any("test", &some).expect("any"));
        // (a call reads with its statement's snapshot; this test's statement began before the overrides
        // were set, so it reads with a snapshot of its own, as a later statement would)
        let of = |key: &str| {
            crate::policies::with_latest_snapshot(|| {
                crate::policies::overrides::of_key("test", &some, key)
            })
            .expect("of_key")
            .map(|o| o.effect)
        };
        assert!(matches!(
            of("a"),
            Some(crate::policies::overrides::Effect::Limit { .. })
        ));
        assert!(matches!(
            of("b"),
            Some(crate::policies::overrides::Effect::Fixed(_))
        ));
        assert_eq!(of("c"), None);
    }

    #[pg_test]
    fn a_dropped_policys_overrides_go_with_it() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_drop', 1, '1 hour');
             SELECT rate_limit.set_override('pt_ovr_drop', 'k', action => 'exempt');
             SELECT rate_limit.drop_policy('pt_ovr_drop')",
        )
        .expect("dropped");
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.key_overrides WHERE policy = 'pt_ovr_drop'"),
            0
        );
        // one left behind by a DELETE is never read by a namesake created later
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_drop', 1, '1 hour');
             SELECT rate_limit.set_override('pt_ovr_drop', 'k', action => 'exempt');
             DELETE FROM rate_limit.policies WHERE name = 'pt_ovr_drop';
             SELECT rate_limit.create_policy('pt_ovr_drop', 1, '1 hour')",
        )
        .expect("recreated");
        assert_eq!(takes("pt_ovr_drop", "k", 2), vec![true, false]);
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.overrides WHERE policy = 'pt_ovr_drop'"),
            0
        );
    }

    #[pg_test]
    fn bad_overrides_are_refused_with_their_sqlstate() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_bad', 1, '1 hour');
             SELECT rate_limit.create_policy('pt_ovr_leases', 2, '1 hour', algorithm => 'concurrency');
             SELECT rate_limit.create_policy('pt_ovr_window', 10, '1 minute', algorithm => 'fixed_window')",
        )
        .expect("policies");
        for (query, sqlstate) in [
            ("SELECT rate_limit.set_override('pt_ovr_bad', 'k')", "22023"),
            ("SELECT rate_limit.set_override('pt_ovr_bad', 'k', action => 'deny', rate => 3)", "22023"),
            ("SELECT rate_limit.set_override('pt_ovr_bad', 'k', action => 'allow')", "22023"),
            ("SELECT rate_limit.set_override('pt_ovr_bad', 'k', rate => 0)", "22023"),
            ("SELECT rate_limit.set_override('pt_ovr_bad', 'k', per => interval '-1 second')", "22023"),
            (
                "SELECT rate_limit.set_override('pt_ovr_bad', 'k', action => 'deny', until => now() - interval '1 second')",
                "22023",
            ),
            // a window's burst is its rate
            ("SELECT rate_limit.set_override('pt_ovr_window', 'k', burst => 20)", "22023"),
            // slower than rate_limit.max_policy_refill_time
            ("SELECT rate_limit.set_override('pt_ovr_bad', 'k', per => interval '1000 years')", "22023"),
            ("SELECT rate_limit.set_override('pt_ovr_none_such', 'k', burst => 2)", "42704"),
            ("SELECT rate_limit.set_override('pt_ovr_leases', 'k', rate => 3)", "42809"),
            ("SELECT rate_limit.set_override('pt_ovr_bad', NULL, burst => 2)", "22004"),
            ("SELECT rate_limit.set_override(NULL, 'k', burst => 2)", "22004"),
            ("SELECT rate_limit.clear_override('pt_ovr_bad', NULL)", "22004"),
        ] {
            assert_eq!(state(query).as_deref(), Some(sqlstate), "{query}");
        }
        assert_eq!(int("SELECT count(*) FROM rate_limit.key_overrides WHERE policy LIKE 'pt_ovr_%' AND key = 'k'"), 0);
        // a window's rate sets its burst
        Spi::run("SELECT rate_limit.set_override('pt_ovr_window', 'k', rate => 3)")
            .expect("window");
        assert_eq!(granted("pt_ovr_window", "k", 5), 3);
    }

    #[pg_test]
    fn only_the_owner_sets_clears_and_lists_overrides() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_roles', 1, '1 hour');
             SELECT rate_limit.set_override('pt_ovr_roles', 'k', action => 'exempt');
             CREATE ROLE pt_ovr_nobody",
        )
        .expect("setup");
        assert_eq!(error_of("SELECT 1"), None); // the helper exists before SET ROLE
        Spi::run("SET ROLE pt_ovr_nobody").expect("set role");
        for query in [
            "SELECT rate_limit.set_override('pt_ovr_roles', 'mine', action => 'exempt')",
            "SELECT rate_limit.clear_override('pt_ovr_roles', 'k')",
            "SELECT count(*) FROM rate_limit.overrides",
            "SELECT count(*) FROM rate_limit.key_overrides",
            "INSERT INTO rate_limit.key_overrides (policy, key, action, set_at) VALUES ('pt_ovr_roles', 'mine', 'exempt', now())",
        ] {
            let quoted = query.replace('\'', "''");
            assert_eq!(
                text(&format!("SELECT left(pg_temp.error_of('{quoted}'), 5)")).as_deref(),
                Some("42501"),
                "{query}"
            );
        }
        // the override still applies to the role's calls
        assert_eq!(granted("pt_ovr_roles", "k", 3), 3);
        Spi::run("RESET ROLE").expect("reset role");
    }

    /// A role that may not read the overrides may be the first to read a policy into the cache (`headers`,
    /// not SECURITY DEFINER); whether the policy has overrides is then read as the table's owner, so what
    /// the backend keeps does not depend on who asked first.
    #[pg_test]
    fn a_role_that_cannot_read_the_overrides_may_load_the_policy_into_the_cache() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_ovr_first', 1, '1 hour');
             SELECT rate_limit.set_override('pt_ovr_first', 'k', action => 'exempt');
             CREATE ROLE pt_ovr_reader",
        )
        .expect("setup");
        // (the set_override's trigger empties this backend's cache at the next command)
        Spi::run("SET ROLE pt_ovr_reader").expect("set role");
        assert_eq!(
            text(
                "SELECT rate_limit.headers(ROW(true, 1, 1, NULL, interval '0', 'pt_ovr_first', false, NULL)::rate_limit.decision, \
                 'pt_ovr_first') ->> 'RateLimit-Policy'"
            )
            .as_deref(),
            Some("\"pt_ovr_first\";q=1;w=3600")
        );
        let cached = crate::policies::get("test", "pt_ovr_first").expect("cached");
        assert!(crate::policies::overrides::any("test", &cached).expect("read as the owner"));
        assert!(crate::policies::with_latest_snapshot(|| {
            crate::policies::overrides::of_key("test", &cached, "k")
        })
        .expect("read as the owner")
        .is_some());
        assert_eq!(
            text("SELECT current_user::text").as_deref(),
            Some("pt_ovr_reader"),
            "the role is restored"
        );
        assert_eq!(granted("pt_ovr_first", "k", 3), 3);
        Spi::run("RESET ROLE").expect("reset role");
    }
}
