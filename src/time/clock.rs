//! The clocks the stores measure time on, in microseconds.
//!
//! - The table store uses the server's wall clock ([`now_us`], what `clock_timestamp()` returns, read fresh
//!   at every call, never the transaction start time that `now()` freezes) minus the shift a promotion
//!   kept ([`table_now_us`], see [`crate::time::clock_shift`]): its state outlives the server and moves with it
//!   to a standby, whose wall clock may be off the primary's.
//! - The memory store lives for one server lifetime and uses a clock that never steps ([`monotonic_us`]),
//!   anchored to the wall clock when the store is created (see `store::memory`).

use pgrx::pg_sys;

/// Microseconds since 2000-01-01 UTC (PostgreSQL's `TimestampTz` epoch) on the server's wall clock.
pub fn now_us() -> i64 {
    // SAFETY: GetCurrentTimestamp reads the system clock and has no preconditions; it cannot raise an error.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// Microseconds since 2000-01-01 UTC on the table store's clock: the wall clock minus the shift this
/// server keeps from a promotion (0 unless its clock was found off its old primary's).
pub fn table_now_us() -> i64 {
    now_us().saturating_sub(crate::time::clock_shift::current())
}

/// Microseconds on a clock that never steps: `CLOCK_BOOTTIME` on Linux (monotonic, and counting time
/// suspended), `CLOCK_MONOTONIC` elsewhere. The same clock for every process of the machine.
pub fn monotonic_us() -> i64 {
    #[cfg(target_os = "linux")]
    const CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
    #[cfg(not(target_os = "linux"))]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; both clocks exist on every
    // supported platform, so it cannot fail (and a failure would leave the zeroed value).
    unsafe { libc::clock_gettime(CLOCK, &mut ts) };
    // time_t and c_long are i64 on every 64-bit platform PostgreSQL supports
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000
}
