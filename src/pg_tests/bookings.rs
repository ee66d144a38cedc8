//! Booked slots in both stores alike: bookings queue at the policy's rate down to its `max_debt`, the
//! time to come back is in `retry_after` and the id in `lease`, a cancel gives the last booking's tokens
//! back once, and every misuse gets its SQLSTATE. Exact times under concurrency are
//! `tests/integration/tests/bookings.rs`'s (here the clock moves between calls: figures are in minutes).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

    /// One token an hour, burst 1, up to 3 tokens booked ahead: the burst now, then an hour apart, then
    /// denied until a slot fits; the last booking cancelled gives its hour back, once.
    #[pg_test]
    fn bookings_queue_at_the_rate_in_both_stores() {
        for store in ["table", "memory"] {
            let p = format!("pt_book_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 1, '1 hour', burst => 1, max_debt => 3, \
                 store => '{store}')"
            ))
            .expect("policy");
            let book = |cost: i64, delay: &str| {
                text(&format!(
                    "SELECT concat_ws(',', allowed, round(extract(epoch FROM retry_after) / 60), \
                            lease IS NOT NULL) \
                     FROM rate_limit.book('{p}', 'k', {cost}, '{delay}')"
                ))
                .unwrap_or_default()
            };
            let queue: Vec<String> = (0..3).map(|_| book(1, "1 day")).collect();
            let last = int(&format!(
                "SELECT lease FROM rate_limit.book('{p}', 'k', 1, '1 day')"
            ));
            let full = book(1, "1 day");
            // the next slot is 4 hours away: a caller waiting 30 minutes at most comes back in 3.5
            let too_soon = book(1, "30 minutes");
            let cancel = |id: i64| {
                text(&format!(
                    "SELECT concat_ws(',', allowed, lease IS NOT NULL) \
                     FROM rate_limit.cancel_booking('{p}', 'k', {id})"
                ))
                .unwrap_or_default()
            };
            let cancelled = cancel(last);
            let again = cancel(last);
            let made_up = cancel(12_345);
            let rebooked = book(1, "1 day");
            assert_eq!(
                queue,
                ["t,0,f", "t,60,t", "t,120,t"],
                "{store}: the burst now, then an hour apart"
            );
            assert_eq!(
                [full, too_soon, cancelled, again, made_up, rebooked],
                ["f,60,f", "f,210,f", "t,t", "f,f", "f,f", "t,180,t"],
                "{store}"
            );
        }
    }

    /// A booking is part of the caller's transaction in the table store: rolled back, its tokens are back.
    #[pg_test]
    fn a_booking_rolled_back_is_undone() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_book_rollback', 1, '1 hour', burst => 1, max_debt => 5, \
             store => 'table')",
        )
        .expect("policy");
        Spi::run("SELECT rate_limit.book('pt_book_rollback', 'k')").expect("the burst");
        Spi::run(
            "DO $$ BEGIN \
               PERFORM rate_limit.book('pt_book_rollback', 'k', 3); \
               RAISE EXCEPTION 'roll back'; \
             EXCEPTION WHEN raise_exception THEN NULL; END $$",
        )
        .expect("rolled back");
        assert_eq!(
            text(
                "SELECT round(extract(epoch FROM retry_after) / 60)::text \
                 FROM rate_limit.book('pt_book_rollback', 'k')"
            )
            .as_deref(),
            Some("60")
        );
    }

    /// Every bad argument of book and cancel_booking gets its SQLSTATE.
    #[pg_test]
    fn booking_misuse_gets_its_sqlstate() {
        Spi::run("SELECT rate_limit.create_policy('pt_book_args', 10, '1 hour', max_debt => 5)")
            .expect("policy");
        Spi::run(
            "SELECT rate_limit.create_policy('pt_book_window', 10, '1 hour', algorithm => 'fixed_window')",
        )
        .expect("policy");
        Spi::run(
            "SELECT rate_limit.create_policy('pt_book_leases', 2, '1 hour', algorithm => 'concurrency')",
        )
        .expect("policy");
        let state = |q: &str| error_of(q).map(|e| e[..5].to_string());
        let cases = [
            ("SELECT rate_limit.book('pt_book_args', 'k', 0)", "22023"),
            ("SELECT rate_limit.book('pt_book_args', 'k', NULL)", "22004"),
            ("SELECT rate_limit.book('pt_book_args', NULL)", "22004"),
            ("SELECT rate_limit.book(NULL, 'k')", "22004"),
            (
                "SELECT rate_limit.book('pt_book_args', 'k', 1, NULL)",
                "22004",
            ),
            (
                "SELECT rate_limit.book('pt_book_args', 'k', 1, '-1 s')",
                "22023",
            ),
            (
                "SELECT rate_limit.book('pt_book_args', 'k', 1, '25 hours')",
                "22023",
            ),
            (
                "SELECT rate_limit.book('pt_book_args', 'k', 1, '1 mon')",
                "22023",
            ),
            ("SELECT rate_limit.book('pt_nope', 'k')", "42704"),
            ("SELECT rate_limit.book('pt_book_window', 'k')", "42809"),
            ("SELECT rate_limit.book('pt_book_leases', 'k')", "42809"),
            (
                "SELECT rate_limit.cancel_booking('pt_book_args', 'k', NULL)",
                "22004",
            ),
            (
                "SELECT rate_limit.cancel_booking('pt_book_args', NULL, 1)",
                "22004",
            ),
            (
                "SELECT rate_limit.cancel_booking('pt_book_leases', 'k', 1)",
                "42809",
            ),
        ];
        for (q, code) in cases {
            assert_eq!(state(q).as_deref(), Some(code), "{q}");
        }
        // a cost beyond the burst plus the debt can never be booked; 0 delay books only what exists
        assert_eq!(
            text(
                "SELECT concat_ws(',', allowed, lease IS NULL, retry_after IS NULL) \
                  FROM rate_limit.book('pt_book_args', 'k', 16)"
            )
            .as_deref(),
            Some("f,t,t")
        );
        assert_eq!(
            text(
                "SELECT concat_ws(',', allowed, retry_after = interval '0', lease IS NULL) \
                  FROM rate_limit.book('pt_book_args', 'k', 10, '0')"
            )
            .as_deref(),
            Some("t,t,t")
        );
    }
}
