//! The monitoring views: what they count (refusals apart from shadow mode's would-be denials), the bound on
//! the keys they show, the background worker's purge record, and who may read them (the owner and
//! `pg_monitor`, nobody else).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

    fn take(policy: &str, key: &str, times: usize) {
        for _ in 0..times {
            Spi::run(&format!("SELECT rate_limit.take('{policy}', '{key}')")).expect("take");
        }
    }

    /// `(calls, granted, denied, shadow_denied, blocked, tokens_granted)` of `policy` in rate_limit.metrics.
    fn metrics(policy: &str) -> (i64, i64, i64, i64, i64, i64) {
        let q = format!(
            "SELECT calls, granted, denied, shadow_denied, blocked, tokens_granted \
             FROM rate_limit.metrics WHERE kind = 'policy' AND policy = '{policy}'"
        );
        Spi::connect(|c| {
            let row = c.select(&q, None, &[])?.first();
            Ok::<_, pgrx::spi::SpiError>((
                row.get(1)?.unwrap_or(-1),
                row.get(2)?.unwrap_or(-1),
                row.get(3)?.unwrap_or(-1),
                row.get(4)?.unwrap_or(-1),
                row.get(5)?.unwrap_or(-1),
                row.get(6)?.unwrap_or(-1),
            ))
        })
        .expect("rate_limit.metrics")
    }

    /// The SQLSTATE `query` raises, if any, through the helper `error_of` created (before any SET ROLE:
    /// the role set cannot replace the owner's helper).
    fn state_of(query: &str) -> Option<String> {
        let quoted = query.replace('\'', "''");
        text(&format!("SELECT left(pg_temp.error_of('{quoted}'), 5)"))
    }

    #[pg_test]
    fn the_metrics_count_refusals_apart_from_would_be_denials() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_met_enforced', 2, '1 hour', store => 'memory');
             SELECT rate_limit.create_policy('pt_met_shadow', 2, '1 hour', shadow => true);
             SELECT rate_limit.create_policy('pt_met_blocked', 2, '1 hour');
             SELECT rate_limit.block('pt_met_blocked', 'b', '1 hour')",
        )
        .expect("policies");
        take("pt_met_enforced", "k", 5);
        take("pt_met_shadow", "k", 5);
        take("pt_met_blocked", "b", 2);
        take("pt_met_blocked", "k", 1);
        // calls = granted + denied + shadow_denied, for a policy called alone
        assert_eq!(metrics("pt_met_enforced"), (5, 2, 3, 0, 0, 2));
        assert_eq!(metrics("pt_met_shadow"), (5, 2, 0, 3, 0, 2));
        assert_eq!(metrics("pt_met_blocked"), (3, 1, 2, 0, 2, 1));
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.metrics WHERE database <> current_database()"),
            0
        );
    }

    /// A lease refused by its key's block is counted as blocked, as a take's refusal is (it was counted as
    /// denied only before 0.5.0's pipeline moved acquire into the model).
    #[pg_test]
    fn a_lease_refused_by_a_block_is_counted_as_blocked() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_met_lease_block', 2, '1 hour', algorithm => 'concurrency');
             SELECT rate_limit.block('pt_met_lease_block', 'b', '1 hour');
             SELECT rate_limit.acquire('pt_met_lease_block', 'b');
             SELECT rate_limit.acquire('pt_met_lease_block', 'b');
             SELECT rate_limit.acquire('pt_met_lease_block', 'k')",
        )
        .expect("a blocked key's acquires");
        assert_eq!(metrics("pt_met_lease_block"), (3, 1, 2, 0, 2, 1));
    }

    /// (No release here: a released slot is a full bucket, which another test's purge would count;
    /// tests/integration/tests/monitoring.rs releases one.)
    #[pg_test]
    fn the_policies_numbers_and_leases_held_are_gauges() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_met_numbers', 10, '1 minute', burst => 4);
             SELECT rate_limit.create_policy('pt_met_leases', 3, '1 hour', algorithm => 'concurrency');
             SELECT rate_limit.acquire('pt_met_leases', 'a');
             SELECT rate_limit.acquire('pt_met_leases', 'a');
             SELECT rate_limit.acquire('pt_met_leases', 'b')",
        )
        .expect("policies and leases");
        let numbers = Spi::get_three::<i64, f64, i64>(
            "SELECT rate, period_seconds, burst FROM rate_limit.metrics_policies \
             WHERE policy = 'pt_met_numbers' AND leases_held IS NULL AND NOT shadow",
        )
        .expect("the gauges");
        assert_eq!(numbers, (Some(10), Some(60.0), Some(4)));
        assert_eq!(
            int("SELECT leases_held FROM rate_limit.metrics_policies WHERE policy = 'pt_met_leases'"),
            3
        );
        Spi::run("SELECT rate_limit.acquire('pt_met_leases', 'c')").expect("acquire");
        assert_eq!(
            int("SELECT leases_held FROM rate_limit.metrics_policies WHERE policy = 'pt_met_leases'"),
            4
        );
    }

    #[pg_test]
    fn the_top_keys_show_no_key_until_the_setting_allows_them() {
        Spi::run("SELECT rate_limit.create_policy('pt_met_top', 1, '1 hour')").expect("policy");
        take("pt_met_top", "first", 4);
        take("pt_met_top", "second", 3);
        take("pt_met_top", "third", 2);
        let shown = "SELECT count(*) FROM rate_limit.metrics_top_keys WHERE policy = 'pt_met_top'";
        assert_eq!(int(shown), 0, "none by default");
        Spi::run("SET rate_limit.metrics_top_keys = 2").expect("set");
        assert_eq!(int(shown), 2);
        assert_eq!(
            int("SELECT denials FROM rate_limit.metrics_top_keys WHERE policy = 'pt_met_top' AND rank = 1 AND key = 'first'"),
            3
        );
        Spi::run("RESET rate_limit.metrics_top_keys").expect("reset");
    }

    #[pg_test]
    fn the_last_purges_are_kept_per_database_and_for_the_memory_store() {
        crate::stats::note_table_purge(crate::time::clock::now_us(), 17);
        crate::stats::note_memory_purge(crate::time::clock::now_us(), 5);
        let rows = Spi::get_two::<i64, i64>(
            "SELECT (SELECT freed FROM rate_limit.metrics_purge WHERE store = 'table'), \
                    (SELECT freed FROM rate_limit.metrics_purge WHERE store = 'memory')",
        )
        .expect("metrics_purge");
        assert_eq!(rows, (Some(17), Some(5)));
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.metrics_purge WHERE finished_at > now() - interval '1 minute'"),
            2
        );
    }

    /// A member of pg_monitor reads every monitoring view and nothing else of the owner's; a role without
    /// it reads none (42501).
    #[pg_test]
    fn only_the_owner_and_pg_monitor_read_the_metrics() {
        Spi::run(
            "CREATE ROLE pt_met_monitor IN ROLE pg_monitor; CREATE ROLE pt_met_nobody;
             SELECT rate_limit.create_policy('pt_met_roles', 1, '1 hour')",
        )
        .expect("roles");
        assert_eq!(error_of("SELECT 1"), None); // creates the helper
        let views = [
            "rate_limit.metrics",
            "rate_limit.metrics_policies",
            "rate_limit.metrics_memory",
            "rate_limit.metrics_purge",
            "rate_limit.metrics_top_keys",
        ];
        Spi::run("SET ROLE pt_met_monitor").expect("set role");
        for v in views {
            assert_eq!(state_of(&format!("SELECT count(*) FROM {v}")), None, "{v}");
        }
        for q in [
            "SELECT count(*) FROM rate_limit.stats",
            "SELECT count(*) FROM rate_limit.buckets",
            "SELECT rate_limit.reset_stats()",
            "SELECT count(*) FROM rate_limit.top_limited_rows()",
            "SELECT rate_limit.block('pt_met_roles', 'k', '1 hour')",
        ] {
            assert_eq!(state_of(q).as_deref(), Some("42501"), "{q}");
        }
        Spi::run("RESET ROLE; SET ROLE pt_met_nobody").expect("set role");
        for v in views {
            assert_eq!(
                state_of(&format!("SELECT count(*) FROM {v}")).as_deref(),
                Some("42501"),
                "{v}"
            );
        }
        Spi::run("RESET ROLE").expect("reset role");
    }

    /// `leases_held_rows` and `adaptive_limits_rows` are SECURITY DEFINER and SQL, parsed at each call with
    /// the caller's search_path: a member of pg_monitor's own `=`, `<>` or `<` operator or `text` type,
    /// placed before pg_catalog, must not be run (it would run as the owner) nor change the counts.
    #[pg_test]
    fn a_pg_monitor_members_look_alike_operators_do_not_run_as_the_owner() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_met_hijack', 2, '1 hour', algorithm => 'concurrency');
             SELECT rate_limit.acquire('pt_met_hijack', 'k');
             SELECT rate_limit.create_policy('pt_met_hijack_a', 4, '1 hour', algorithm => 'concurrency',
                 options => '{\"latency_target\": \"1 second\"}');
             SELECT rate_limit.release('pt_met_hijack_a', 'k', lease, 'dropped')
               FROM rate_limit.acquire('pt_met_hijack_a', 'k');
             CREATE ROLE pt_met_hijacker IN ROLE pg_monitor;
             CREATE SCHEMA pt_met_evil AUTHORIZATION pt_met_hijacker;
             SET ROLE pt_met_hijacker;
             CREATE FUNCTION pt_met_evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'hijacked as %', current_user; END $$;
             CREATE OPERATOR pt_met_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pt_met_evil.eq);
             CREATE OPERATOR pt_met_evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = pt_met_evil.eq);
             CREATE FUNCTION pt_met_evil.lt(numeric, bigint) RETURNS boolean LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'hijacked as %', current_user; END $$;
             CREATE OPERATOR pt_met_evil.< (LEFTARG = numeric, RIGHTARG = bigint, FUNCTION = pt_met_evil.lt);
             CREATE DOMAIN pt_met_evil.text AS pg_catalog.int4;
             SET search_path = pt_met_evil, pg_catalog",
        )
        .expect("the look-alikes");
        let held = Spi::get_one::<i64>(
            "SELECT leases_held FROM rate_limit.metrics_policies \
             WHERE policy OPERATOR(pg_catalog.=) 'pt_met_hijack'",
        );
        let cut = Spi::get_two::<i64, f64>(
            "SELECT adaptive_limited_keys, adaptive_lowest_limit FROM rate_limit.metrics_policies \
             WHERE policy OPERATOR(pg_catalog.=) 'pt_met_hijack_a'",
        );
        Spi::run("RESET search_path; RESET ROLE").expect("reset");
        assert_eq!(held.expect("no look-alike ran"), Some(1));
        assert_eq!(cut.expect("no look-alike ran"), (Some(1), Some(3.6)));
    }
}
