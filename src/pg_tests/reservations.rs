//! Reservations in both stores alike: a reserve takes its estimate and returns an id, a settle gives back
//! what was not used or charges the excess once, an unknown or expired reservation settles nothing, and
//! every misuse gets its SQLSTATE.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

    /// Reserves and settles in the table store, within one transaction (the memory store's settles wait
    /// for a commit, which a `#[pg_test]` never reaches: `tests/integration/tests/reservations.rs` runs the
    /// same calls in both stores from a client).
    #[pg_test]
    fn reserve_and_settle_in_the_table_store() {
        {
            let store = "table";
            let p = format!("pt_reserve_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 100, '1 hour', max_debt => 50, store => '{store}')"
            ))
            .expect("policy");
            let row = |q: String| text(&q).unwrap_or_default();
            let first = text(&format!(
                "SELECT concat_ws(',', allowed, remaining, lease) FROM rate_limit.reserve('{p}', 'k', 30)"
            ))
            .unwrap_or_default();
            let r1: i64 = first
                .rsplit(',')
                .next()
                .and_then(|id| id.parse().ok())
                .expect("an id");
            assert!(first.starts_with("t,70,") && r1 > 0, "{store}: {first}");
            let settle = |id: i64, actual: i64| {
                row(format!(
                    "SELECT concat_ws(',', allowed, remaining, lease IS NOT NULL) \
                     FROM rate_limit.settle('{p}', 'k', {id}, {actual})"
                ))
            };
            let used_less = settle(r1, 10);
            let again = settle(r1, 0);
            let r2 = int(&format!(
                "SELECT lease FROM rate_limit.reserve('{p}', 'k', 90)"
            ));
            let short = row(format!(
                "SELECT concat_ws(',', allowed, remaining, lease IS NULL) FROM rate_limit.reserve('{p}', 'k', 1)"
            ));
            let used_more = settle(r2, 120);
            let tokens = row(format!(
                "SELECT round(tokens)::text FROM rate_limit.buckets WHERE policy = '{p}' AND key = 'k' \
                 AND algorithm <> 'reservation'"
            ));
            let unknown = settle(12_345, 0);
            let other_key = row(format!(
                "SELECT allowed::text FROM rate_limit.settle('{p}', 'other', {r1}, 0)"
            ));
            let stats = row(format!(
                "SELECT concat_ws(',', calls, granted, denied) FROM rate_limit.stats WHERE policy = '{p}'"
            ));
            assert_eq!(
                [used_less, again, short, used_more, tokens, unknown, other_key, stats],
                ["t,90,t", "f,90,f", "f,0,t", "t,0,t", "-30", "f,0,f", "false", "3,2,1"],
                "{store}"
            );
            assert!(r2 != r1);
        }
    }

    /// In the memory store a settle answers what it will do when the transaction commits, and until then
    /// changes nothing: a second settle of the same reservation in the transaction settles nothing.
    #[pg_test]
    fn a_memory_store_settle_waits_for_the_commit() {
        Spi::run("SELECT rate_limit.create_policy('pt_reserve_commit', 100, '1 hour', store => 'memory')")
            .expect("policy");
        let id = int("SELECT lease FROM rate_limit.reserve('pt_reserve_commit', 'k', 30)");
        let figures: Vec<String> = [
            format!("SELECT concat_ws(',', allowed, remaining, lease IS NOT NULL) FROM rate_limit.settle('pt_reserve_commit', 'k', {id}, 10)"),
            format!("SELECT concat_ws(',', allowed, remaining, lease IS NOT NULL) FROM rate_limit.settle('pt_reserve_commit', 'k', {id}, 0)"),
            "SELECT remaining::text FROM rate_limit.peek('pt_reserve_commit', 'k')".to_string(),
        ]
        .iter()
        .map(|q| text(q).unwrap_or_default())
        .collect();
        assert_eq!(figures, ["t,90,t", "f,70,f", "70"]);
    }

    /// A reservation not settled within its hold is settled at its estimate: its tokens stay taken and a
    /// late settle gives nothing back; its bucket is full, so the purge deletes it.
    #[pg_test]
    fn an_unsettled_reservation_expires_at_its_estimate() {
        for store in ["table", "memory"] {
            let p = format!("pt_reserve_hold_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 10, '1 hour', store => '{store}')"
            ))
            .expect("policy");
            let id = int(&format!(
                "SELECT lease FROM rate_limit.reserve('{p}', 'k', 4, hold => '10 ms')"
            ));
            Spi::run("SELECT pg_sleep(0.05)").expect("sleep");
            let late = text(&format!(
                "SELECT concat_ws(',', allowed, remaining) FROM rate_limit.settle('{p}', 'k', {id}, 0)"
            ));
            assert_eq!(late.as_deref(), Some("f,6"), "{store}");
        }
    }

    /// A settle is part of the caller's transaction in the table store: rolled back, it is not applied,
    /// and the reservation can still be settled.
    #[pg_test]
    fn a_settle_rolled_back_is_not_applied() {
        Spi::run("SELECT rate_limit.create_policy('pt_reserve_rollback', 10, '1 hour', store => 'table')")
            .expect("policy");
        let id = int("SELECT lease FROM rate_limit.reserve('pt_reserve_rollback', 'k', 8)");
        Spi::run(&format!(
            "DO $$ BEGIN \
               PERFORM rate_limit.settle('pt_reserve_rollback', 'k', {id}, 0); \
               RAISE EXCEPTION 'roll back'; \
             EXCEPTION WHEN raise_exception THEN NULL; END $$"
        ))
        .expect("rolled back");
        assert_eq!(
            text(&format!(
                "SELECT concat_ws(',', allowed, remaining) FROM rate_limit.settle('pt_reserve_rollback', 'k', {id}, 3)"
            ))
            .as_deref(),
            Some("t,7")
        );
    }

    /// Every bad argument of reserve and settle gets its SQLSTATE.
    #[pg_test]
    fn reservation_misuse_gets_its_sqlstate() {
        Spi::run("SELECT rate_limit.create_policy('pt_reserve_args', 10, '1 hour')")
            .expect("policy");
        Spi::run(
            "SELECT rate_limit.create_policy('pt_reserve_leases', 2, '1 hour', algorithm => 'concurrency')",
        )
        .expect("policy");
        let state = |q: &str| error_of(q).map(|e| e[..5].to_string());
        let cases = [
            (
                "SELECT rate_limit.reserve('pt_reserve_args', 'k', 0)",
                "22023",
            ),
            (
                "SELECT rate_limit.reserve('pt_reserve_args', 'k', NULL)",
                "22004",
            ),
            (
                "SELECT rate_limit.reserve('pt_reserve_args', NULL, 1)",
                "22004",
            ),
            (
                "SELECT rate_limit.reserve('pt_reserve_args', 'k', 1, NULL)",
                "22004",
            ),
            (
                "SELECT rate_limit.reserve('pt_reserve_args', 'k', 1, '0 s')",
                "22023",
            ),
            (
                "SELECT rate_limit.reserve('pt_reserve_args', 'k', 1, '-1 s')",
                "22023",
            ),
            (
                "SELECT rate_limit.reserve('pt_reserve_args', 'k', 1, '2 days')",
                "22023",
            ),
            ("SELECT rate_limit.reserve('pt_nope', 'k', 1)", "42704"),
            (
                "SELECT rate_limit.reserve('pt_reserve_leases', 'k', 1)",
                "42809",
            ),
            (
                "SELECT rate_limit.settle('pt_reserve_args', 'k', 1, -1)",
                "22023",
            ),
            (
                "SELECT rate_limit.settle('pt_reserve_args', 'k', NULL, 1)",
                "22004",
            ),
            (
                "SELECT rate_limit.settle('pt_reserve_args', 'k', 1, NULL)",
                "22004",
            ),
            (
                "SELECT rate_limit.settle('pt_reserve_leases', 'k', 1, 1)",
                "42809",
            ),
        ];
        for (q, code) in cases {
            assert_eq!(state(q).as_deref(), Some(code), "{q}");
        }
        // the largest hold, and an estimate above the burst (never granted, nothing recorded)
        assert_eq!(
            text(
                "SELECT concat_ws(',', allowed, lease IS NULL, retry_after IS NULL) \
                  FROM rate_limit.reserve('pt_reserve_args', 'k', 11, '1 day')"
            )
            .as_deref(),
            Some("f,t,t")
        );
    }
}
