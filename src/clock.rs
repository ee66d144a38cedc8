//! The server's clock, in microseconds: what `clock_timestamp()` returns, read fresh at every call (never the
//! transaction start time that `now()` freezes).

use pgrx::pg_sys;

/// Microseconds since 2000-01-01 UTC (PostgreSQL's `TimestampTz` epoch) on the server's clock.
pub fn now_us() -> i64 {
    // SAFETY: GetCurrentTimestamp reads the system clock and has no preconditions; it cannot raise an error.
    unsafe { pg_sys::GetCurrentTimestamp() }
}
