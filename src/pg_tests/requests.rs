//! The reference function's timeline, peeks, exact tokens, resets, purges and the table store's own
//! arithmetic: what `rate_limiting_request` and its companions answer.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{int, requests, text};

    #[pg_test]
    fn first_call_starts_full_and_defaults_apply() {
        assert_eq!(
            int("SELECT rate_limiting_request('pt_defaults')::bigint"),
            119
        );
        assert_eq!(
            int("SELECT rate_limiting_request('pt_defaults', 2)::bigint"),
            118
        );
        assert_eq!(
            int("SELECT rate_limiting_request('pt_five', 5, 1)::bigint"),
            4
        );
    }

    #[pg_test]
    fn reference_timeline_then_refill() {
        assert_eq!(
            requests("pt_timeline", 1, 10, 12),
            vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -1]
        );
        Spi::run("SELECT pg_sleep(1.2)").expect("sleep");
        // 1.2 tokens refilled (the denied calls took none): one is taken, 0.2 stays
        assert_eq!(requests("pt_timeline", 1, 10, 2), vec![0, -1]);
    }

    #[pg_test]
    fn peek_consumes_nothing() {
        assert_eq!(
            int("SELECT rate_limit.peek_request('pt_peek', 1, 100)"),
            100
        );
        requests("pt_peek", 1, 100, 3);
        assert_eq!(int("SELECT rate_limit.peek_request('pt_peek', 1, 100)"), 97);
        assert_eq!(int("SELECT rate_limit.peek_request('pt_peek', 1, 100)"), 97);
        assert_eq!(requests("pt_peek", 1, 100, 1), vec![96]);
    }

    #[pg_test]
    fn tokens_is_exact_and_consumes_nothing() {
        assert_eq!(
            text("SELECT rate_limit.tokens('pt_tokens', 1, 100)::text").as_deref(),
            Some("100.000000")
        );
        requests("pt_tokens", 1, 100, 3);
        assert_eq!(
            text("SELECT (rate_limit.tokens('pt_tokens', 1, 100) BETWEEN 97 AND 97.5)::text")
                .as_deref(),
            Some("true")
        );
        assert_eq!(requests("pt_tokens", 1, 100, 1), vec![96]);
    }

    #[pg_test]
    fn reset_makes_a_bucket_full() {
        requests("pt_reset", 1, 5, 5);
        assert_eq!(requests("pt_reset", 1, 5, 1), vec![-1]);
        assert_eq!(
            text("SELECT rate_limit.reset_request('pt_reset')::text").as_deref(),
            Some("true")
        );
        assert_eq!(
            text("SELECT rate_limit.reset_request('pt_reset')::text").as_deref(),
            Some("false")
        );
        assert_eq!(requests("pt_reset", 1, 5, 1), vec![4]);
    }

    /// `TAKE` names the arithmetic in its WHERE and its SET: a grant on an existing row evaluates it once
    /// (twice before the per-row memo), a denial once.
    #[pg_test]
    fn a_table_store_grant_evaluates_the_arithmetic_once() {
        use crate::store::table_evaluations as evaluations;
        requests("pt_once", 1, 100, 1); // creates the row (no TAKE arithmetic on a missing row)
        let before = evaluations();
        assert_eq!(requests("pt_once", 1, 100, 3), vec![98, 97, 96]);
        assert_eq!(evaluations() - before, 3);
        let before = evaluations();
        assert_eq!(requests("pt_once_short", 1, 1, 2), vec![0, -1]);
        assert_eq!(evaluations() - before, 1); // the denial's UPDATE updated nothing
    }

    #[pg_test]
    fn purge_deletes_exactly_the_full_buckets() {
        Spi::run("DELETE FROM rate_limit.bucket_state").expect("clean");
        requests("pt_purge_drained", 1, 100, 2); // 98 of 100: not full for ~2 s
        requests("pt_purge_refills", 1000, 1, 1); // 999 of 1000: full again after 1 ms
        Spi::run("SELECT pg_sleep(0.05)").expect("sleep");
        // purge() also deletes the full memory-store buckets of this database, which tests running
        // beside this one make (the memory store is not transactional): its count is checked on the
        // table alone, which only this test writes
        let rows = "SELECT count(*) FROM rate_limit.bucket_state";
        assert_eq!(int(rows), 2);
        assert!(int("SELECT rate_limit.purge()") >= 1);
        assert_eq!(
            text("SELECT string_agg(key, ',') FROM rate_limit.bucket_state").as_deref(),
            Some("pt_purge_drained")
        );
        int("SELECT rate_limit.purge()");
        assert_eq!(int(rows), 1);
    }

    #[pg_test]
    fn buckets_view_shows_exact_tokens() {
        requests("pt_view", 1, 100, 3);
        assert_eq!(
            text(
                "SELECT format('%s %s %s %s %s %s', kind, \"limit\", rate, per, store, \
                        tokens BETWEEN 97 AND 97.5) FROM rate_limit.buckets WHERE key = 'pt_view'"
            )
            .as_deref(),
            Some("request 100 1 00:00:01 table t")
        );
    }
}
