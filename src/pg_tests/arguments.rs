//! Bad arguments and settings: every one raises its SQLSTATE (never a NULL a caller could read as
//! "allowed"), and the limits on ids are where the documents say.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

    #[pg_test]
    fn state_tokens_is_the_exact_arithmetic_and_rejects_bad_numbers_with_22023() {
        // 0.5 token at t, 2 tokens/s: 0.25 s later 1.0 token; capped at capacity; a backward clock adds nothing
        let q = |at: &str| {
            text(&format!(
                "SELECT rate_limit.state_tokens(500000, '2026-01-01 00:00:00+00', 'token_bucket', 2, \
                 1000000, 3, '{at}')::text"
            ))
        };
        assert_eq!(q("2026-01-01 00:00:00.25+00").as_deref(), Some("1.000000"));
        assert_eq!(q("2026-01-01 01:00:00+00").as_deref(), Some("3.000000"));
        assert_eq!(q("2025-12-31 23:00:00+00").as_deref(), Some("0.500000"));
        assert_eq!(
            error_of(
                "SELECT rate_limit.state_tokens(0, now(), 'token_bucket', 0, 1000000, 3, now())"
            )
            .as_deref(),
            Some("22023: invalid bucket numbers: the refill rate must be at least 1")
        );
        assert_eq!(
            error_of(
                "SELECT rate_limit.state_after_take(0, now(), 'leaky', 1, 1, 1, 'token_bucket', 1, 1, 1, \
                 now(), now(), 1, now())"
            )
            .as_deref(),
            Some("22023: invalid bucket numbers: unknown algorithm \"leaky\"")
        );
    }

    #[pg_test]
    fn null_arguments_raise_22004() {
        assert_eq!(
            error_of("SELECT rate_limiting_request(NULL)").as_deref(),
            Some("22004: id must not be NULL")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_null', NULL)").as_deref(),
            Some("22004: refill_per_sec must not be NULL")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_null', 1, NULL)").as_deref(),
            Some("22004: window_seconds must not be NULL")
        );
        assert_eq!(
            error_of("SELECT rate_limit.peek_request(NULL)").as_deref(),
            Some("22004: id must not be NULL")
        );
    }

    #[pg_test]
    fn out_of_range_arguments_raise_22023_and_22003() {
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_range', 0, 60)").as_deref(),
            Some("22023: refill_per_sec must be between 1 and 2147483647, got 0")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_range', 2, -5)").as_deref(),
            Some("22023: window_seconds must be between 1 and 2147483647, got -5")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_range', 65536, 32769)").as_deref(),
            Some("22003: capacity refill_per_sec * window_seconds = 2147549184 is too large")
        );
        // the largest capacity: 2^31 tokens, so 2^31 - 1 remain after the first call
        assert_eq!(
            int("SELECT rate_limiting_request('pt_range_max', 65536, 32768)::bigint"),
            2_147_483_647
        );
        assert_eq!(
            int("SELECT rate_limit.peek_request('pt_range_max2', 65536, 32768)"),
            2_147_483_648
        );
    }

    #[pg_test]
    fn long_ids_work_up_to_the_documented_limit() {
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('k', 1024), 1, 5)::bigint"),
            4
        );
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('k', 2048), 1, 5)::bigint"),
            4
        );
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('k', 2048), 1, 5)::bigint"),
            3
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request(repeat('k', 2049), 1, 5)").as_deref(),
            Some("22023: id is 2049 bytes long; the longest id accepted is 2048 bytes")
        );
        // multibyte text counts in bytes; an empty id is a key like any other
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('é', 1024), 1, 5)::bigint"),
            4
        );
        assert_eq!(int("SELECT rate_limiting_request('', 1, 5)::bigint"), 4);
    }

    /// The `rate_limit.` prefix is reserved: a misspelt setting is refused, not kept as a placeholder.
    #[cfg(not(any(feature = "pg13", feature = "pg14")))]
    #[pg_test]
    fn misspelt_settings_are_refused() {
        assert_eq!(
            error_of("SET rate_limit.max_wiat = 5").as_deref(),
            Some("42602: invalid configuration parameter name \"rate_limit.max_wiat\"")
        );
    }

    #[pg_test]
    fn store_setting_is_validated() {
        assert_eq!(
            error_of("SET rate_limit.store = 'redis'").as_deref(),
            Some("22023: invalid value for parameter \"rate_limit.store\": \"redis\"")
        );
    }
}
