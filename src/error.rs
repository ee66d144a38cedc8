//! The errors a caller can meet, each with its SQLSTATE, a message naming the argument and the valid range,
//! and a hint saying what to pass instead. No Rust panic text ever reaches a user for bad input.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::SpiError;
use pgrx::PgSqlErrorCode;

/// The longest id accepted, in bytes. Ids are the primary key of `rate_limit.bucket_state`, and a btree entry
/// must fit in a third of a page (about 2.7 kB), so the limit leaves room for the index tuple header.
pub const MAX_ID_BYTES: usize = 2048;

/// 22004: a required argument was NULL. `hint` says what to pass.
pub fn null_argument(function: &'static str, argument: &str, hint: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{argument} must not be NULL"),
        function,
    )
    .set_hint(hint.to_string())
}

/// 22023: an argument that is not valid, with what is wrong (`message`) and what to pass (`hint`).
pub fn invalid_value(function: &'static str, message: String, hint: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        message,
        function,
    )
    .set_hint(hint.to_string())
}

/// 22023: a number outside its valid range.
pub fn out_of_range(
    function: &'static str,
    argument: &str,
    got: i64,
    min: i64,
    max: i64,
) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{argument} must be between {min} and {max}, got {got}"),
        function,
    )
    .set_hint(format!(
        "Pass a whole number from {min} to {max} for {argument}."
    ))
}

/// 22003: `refill_per_sec × window_seconds` tokens cannot be counted in the `int` the call returns.
pub fn capacity_too_large(function: &'static str, capacity: i128, max: i64) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
        format!("capacity refill_per_sec * window_seconds = {capacity} is too large"),
        function,
    )
    .set_detail(format!(
        "The remaining tokens are returned as int, so the capacity may be at most {max}."
    ))
    .set_hint("Lower refill_per_sec or window_seconds.")
}

/// 22023: a key (named `argument`) longer than [`MAX_ID_BYTES`].
pub fn key_too_long(function: &'static str, argument: &str, len: usize) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{argument} is {len} bytes long; the longest {argument} accepted is {MAX_ID_BYTES} bytes"),
        function,
    )
    .set_hint("Use a shorter key, or a digest of a long one, e.g. md5(key).")
}

/// 25006: the table store cannot record a granted call in a read-only transaction.
pub fn read_only(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        "cannot take a token in a read-only transaction",
        function,
    )
    .set_detail("The table store records every granted call in a table of schema rate_limit.")
    .set_hint(
        "Call it in a read-write transaction on the primary, or use the memory store, which works in \
         read-only transactions and on standbys: SET rate_limit.store = 'memory' (needs \
         shared_preload_libraries = 'rate_limit').",
    )
}

/// XX000: an SPI failure, which only a bug or a damaged installation can cause.
pub fn internal(function: &'static str, error: SpiError) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("rate_limit internal error: {error}"),
        function,
    )
    .set_hint("Check that the extension is installed intact (ALTER EXTENSION rate_limit UPDATE).")
}

/// XX000: a broken internal contract (a bug), reported instead of a panic.
pub fn bug(function: &'static str, what: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("rate_limit internal error: {what}"),
        function,
    )
}

/// Millionths of a token as an exact `numeric` (e.g. 1500000 → 1.500000).
pub fn millionths_numeric(
    function: &'static str,
    millionths: i64,
) -> Result<pgrx::AnyNumeric, ErrorReport> {
    pgrx::AnyNumeric::try_from(
        crate::algorithm::token_bucket::millionths_to_decimal(millionths).as_str(),
    )
    .map_err(|e| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            e.to_string(),
            function,
        )
    })
}

/// XX000: a stored row that the extension could not have written.
pub fn corrupt_row(function: &'static str, what: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("a rate_limit table holds an invalid row: {what}"),
        function,
    )
    .set_hint("Delete the bucket with rate_limit.reset, rate_limit.reset_ad_hoc or rate_limit.reset_request.")
}

/// 22023: numbers passed to an internal helper that do not make a limit or a state.
pub fn invalid_numbers(function: &'static str, what: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("invalid bucket numbers: {what}"),
        function,
    )
    .set_hint(
        "This helper is internal to rate_limit; call rate_limit.take or rate_limiting_request instead.",
    )
}

/// 22023: a limit that cannot be counted exactly (see [`crate::algorithm::token_bucket::LimitError`]).
pub fn out_of_range_limit(function: &'static str, what: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        what.to_string(),
        function,
    )
    .set_hint("Pass a positive refill rate and capacity.")
}
