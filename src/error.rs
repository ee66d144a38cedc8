//! The errors a caller can meet, each with its SQLSTATE, a message naming the argument and the valid range,
//! and a hint saying what to pass instead. No Rust panic text ever reaches a user for bad input.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::SpiError;
use pgrx::PgSqlErrorCode;

/// Turns off the capture of Rust backtraces in this library, whatever the server's environment says.
///
/// pgrx puts a captured backtrace into the DETAIL of the error it reports (a PostgreSQL error raised
/// inside one of our queries, a cancelled wait, a panic), and `std` captures one whenever the server
/// runs with `RUST_BACKTRACE` set: a client would then read our stack. `RUST_LIB_BACKTRACE` takes
/// precedence over `RUST_BACKTRACE` for captures (not for panic messages, which pgrx does not print on
/// a backend's thread), and `std` reads it once, at the first capture; each Rust library linked into a
/// server has its own copy of `std`, so only this library is affected. Called first in `_PG_init`,
/// before any capture: in the postmaster when preloaded (its children inherit the setting), else in the
/// backend that loads the library. Tested by `misuse.rs` against a server started with
/// `RUST_BACKTRACE=1`.
pub fn never_capture_backtraces() {
    // A PostgreSQL process runs our code on one thread only (pgrx checks it), and no other thread of this
    // process reads the environment while `_PG_init` runs, so changing it here races with nothing.
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
}

/// The longest id accepted, in bytes. Ids are the primary key of `rate_limit.bucket_state`, and a btree entry
/// must fit in a third of a page (about 2.7 kB), so the limit leaves room for the index tuple header.
pub const MAX_ID_BYTES: usize = 2048;

/// The most characters of a caller's text that a message quotes ([`quoted`]).
pub const QUOTED_CHARS: usize = 64;

/// A caller's text as a message quotes it: in double quotes, cut to its first [`QUOTED_CHARS`] characters
/// with its length in bytes said when it is longer, so that no argument (a policy name, a key, a time
/// zone, up to 1 GB of text) is copied whole into a message, the server log or a client's screen.
pub fn quoted(text: &str) -> String {
    let mut chars = text.char_indices();
    match chars.nth(QUOTED_CHARS) {
        None => format!("\"{text}\""),
        Some((cut, _)) => format!("\"{}…\" ({} bytes)", &text[..cut], text.len()),
    }
}

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

/// 25006: the table store cannot record what `function` does in a read-only transaction.
pub fn read_only(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        format!("cannot {} in a read-only transaction", read_only_action(function)),
        function,
    )
    .set_detail("The table store records every granted call in a table of schema rate_limit.")
    .set_hint(
        "Call it in a read-write transaction on the primary, or use the memory store, which works in \
         read-only transactions and on standbys: SET rate_limit.store = 'memory' (needs \
         shared_preload_libraries = 'rate_limit').",
    )
}

/// What a call of `function` would have written, for its 25006 message.
fn read_only_action(function: &str) -> &'static str {
    match function {
        "rate_limit.acquire" => "acquire a lease",
        "rate_limit.release" => "release a lease",
        "rate_limit.charge" => "charge a bucket",
        "rate_limit.block" => "block a key",
        "rate_limit.unblock" => "unblock a key",
        "rate_limit.refund" => "refund tokens",
        "rate_limit.reset" | "rate_limit.reset_ad_hoc" | "rate_limit.reset_request" => {
            "reset a bucket"
        }
        _ => "take a token",
    }
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
        rate_limit_model::algorithm::token_bucket::millionths_to_decimal(millionths).as_str(),
    )
    .map_err(|e| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            e.to_string(),
            function,
        )
    })
}

/// XX001: a stored row that the extension could not have written.
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

/// 22023: a limit that cannot be counted exactly (see [`rate_limit_model::algorithm::token_bucket::LimitError`]).
pub fn out_of_range_limit(function: &'static str, what: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        what.to_string(),
        function,
    )
    .set_hint("Pass a positive refill rate and capacity.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_cuts_long_text_and_says_its_length() {
        assert_eq!(quoted("api"), "\"api\"");
        let exact = "é".repeat(QUOTED_CHARS);
        assert_eq!(quoted(&exact), format!("\"{exact}\""));
        let long = "é".repeat(1 << 20);
        let shown = quoted(&long);
        assert_eq!(
            shown,
            format!("\"{}…\" (2097152 bytes)", "é".repeat(QUOTED_CHARS))
        );
    }
}
