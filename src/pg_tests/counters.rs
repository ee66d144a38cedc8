//! The statistics count would-be denials in shadow mode and denials by a block apart from the others (the
//! counters the metrics read), and keep them across a save and load.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::stats::{rows, Totals};

    /// The counters of `policy` in this database now.
    fn totals(policy: &str) -> Totals {
        rows("test")
            .expect("statistics")
            .into_iter()
            .find(|r| r.name == policy)
            .map(|r| r.totals)
            .unwrap_or_default()
    }

    fn take(policy: &str, key: &str) {
        Spi::run(&format!("SELECT rate_limit.take('{policy}', '{key}')")).expect("take");
    }

    #[pg_test]
    fn would_be_denials_in_shadow_mode_are_counted_apart() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_cnt_shadow', 1, '1 hour', shadow => true, store => 'memory')",
        )
        .expect("policy");
        take("pt_cnt_shadow", "k");
        take("pt_cnt_shadow", "k");
        take("pt_cnt_shadow", "k");
        let t = totals("pt_cnt_shadow");
        assert_eq!(
            (t.calls, t.granted, t.denied, t.shadow_denied, t.blocked),
            (3, 1, 2, 2, 0)
        );
    }

    #[pg_test]
    fn denials_by_a_block_are_counted_apart_in_both_stores() {
        for store in ["memory", "table"] {
            let p = format!("pt_cnt_block_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 100, '1 minute', store => '{store}')"
            ))
            .expect("policy");
            Spi::run(&format!("SELECT rate_limit.block('{p}', 'bad', '1 hour')")).expect("block");
            let before = totals(&p);
            take(&p, "bad");
            take(&p, "bad");
            take(&p, "good");
            let t = totals(&p);
            assert_eq!(
                (
                    t.calls - before.calls,
                    t.granted - before.granted,
                    t.denied - before.denied,
                    t.shadow_denied - before.shadow_denied,
                    t.blocked - before.blocked
                ),
                (3, 1, 2, 0, 2),
                "{store}"
            );
        }
    }
}
