//! The memory store (the test cluster preloads the library, rate_limit.max_buckets = 4096): the same
//! answers as the table store, its listing and its size.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{int, requests, text};

    #[pg_test]
    fn memory_store_follows_the_reference_timeline() {
        Spi::run("SET rate_limit.store = 'memory'").expect("memory store");
        assert_eq!(
            requests("pm_timeline", 1, 10, 12),
            vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -1]
        );
        // nothing went to the table
        Spi::run("SET rate_limit.store = 'table'").expect("table store");
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.bucket_state WHERE key = 'pm_timeline'"),
            0
        );
    }

    /// The same calls, with the same pauses, give the same answers from both stores. 2 tokens/s into a
    /// capacity of 10, from a full bucket at t0: the 12 quick calls answer 9..0, -1, -1 if the 12th comes
    /// before t0 + 0.5 s; after a pause of 1.25 s the bucket holds 2 * (t - t0) tokens (all 10 were taken
    /// by then), so the next three calls and a peek answer 1, 0, -1, 0 if they all come before t0 + 1.5 s.
    /// A run counts only
    /// when the time measured around it proves both (the measured spans contain the true ones); a slower
    /// run is repeated with a fresh key.
    #[pg_test]
    fn both_stores_give_identical_answers() {
        use std::time::{Duration, Instant};
        let run = |store: &str, attempt: usize| -> Option<Vec<i64>> {
            Spi::run(&format!("SET rate_limit.store = '{store}'")).expect("store");
            let id = format!("pm_same_{store}_{attempt}");
            let start = Instant::now();
            let mut out = requests(&id, 2, 5, 12);
            let quick = start.elapsed();
            Spi::run("SELECT pg_sleep(1.25)").expect("sleep");
            out.extend(requests(&id, 2, 5, 3));
            out.push(int(&format!(
                "SELECT rate_limit.peek_request('{id}', 2, 5)"
            )));
            let measured =
                quick < Duration::from_millis(500) && start.elapsed() < Duration::from_millis(1500);
            measured.then_some(out)
        };
        for store in ["table", "memory"] {
            let answers = (0..5)
                .find_map(|attempt| run(store, attempt))
                .unwrap_or_else(|| {
                    panic!("no run of 5 on the {store} store was fast enough to measure")
                });
            assert_eq!(
                answers,
                vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -1, 1, 0, -1, 0],
                "{store} store"
            );
        }
    }

    #[pg_test]
    fn memory_store_peek_reset_purge_and_view() {
        Spi::run("SET rate_limit.store = 'memory'").expect("memory store");
        requests("pm_manage", 1, 100, 3);
        requests("pm_refills", 1000, 1, 1); // full again after 1 ms
        assert_eq!(
            int("SELECT rate_limit.peek_request('pm_manage', 1, 100)"),
            97
        );
        assert_eq!(
            text(
                "SELECT format('%s %s %s %s', store, \"limit\", rate, tokens BETWEEN 97 AND 97.5) \
                 FROM rate_limit.buckets WHERE key = 'pm_manage'"
            )
            .as_deref(),
            Some("memory 100 1 t")
        );
        Spi::run("SELECT pg_sleep(0.01)").expect("sleep");
        assert!(int("SELECT rate_limit.purge()") >= 1);
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE key = 'pm_refills'"),
            0
        );
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE key = 'pm_manage'"),
            1
        );
        assert_eq!(
            text("SELECT rate_limit.reset_request('pm_manage')::text").as_deref(),
            Some("true")
        );
        assert_eq!(
            text("SELECT rate_limit.reset_request('pm_manage')::text").as_deref(),
            Some("false")
        );
        assert_eq!(
            int("SELECT rate_limit.peek_request('pm_manage', 1, 100)"),
            100
        );
    }

    #[pg_test]
    fn memory_store_lists_long_ids_by_prefix() {
        Spi::run("SET rate_limit.store = 'memory'").expect("memory store");
        let long = "L".repeat(1000);
        assert_eq!(
            int(&format!(
                "SELECT rate_limiting_request('{long}', 1, 5)::bigint"
            )),
            4
        );
        assert_eq!(
            int(&format!(
                "SELECT rate_limiting_request('{long}', 1, 5)::bigint"
            )),
            3
        );
        // a slot keeps the first 24 bytes of a key for display
        let shown = format!("{}…", "L".repeat(24));
        assert_eq!(
            int(&format!(
                "SELECT count(*) FROM rate_limit.buckets WHERE key = '{shown}'"
            )),
            1
        );
    }

    #[pg_test]
    fn memory_usage_reports_size_within_144_bytes_per_bucket() {
        // 96-byte slots with 25% to spare, and 16 bytes per bucket that count the shares
        assert_eq!(
            text(
                "SELECT format('%s %s %s', max_buckets, slot_bytes, bytes_per_bucket <= 144) \
                 FROM rate_limit.memory_usage()"
            )
            .as_deref(),
            Some("4096 96 t")
        );
    }
}
