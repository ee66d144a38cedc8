//! The PL/Proxy router's deadline (`router/plproxy.sql`): every forwarded call ends within the router's
//! `timeout`, even when a partition stops answering without closing its connections (a frozen process, a
//! host that stopped). Loaded into the router database by two C functions the router file declares; not
//! part of the extension's SQL (the router database does not have the extension).
//!
//! Why PostgreSQL's lock timeout: PL/Proxy 2.10-2.12 check their own `query_timeout` only when a
//! partition's socket has an event, which a frozen partition never gives, and a statement timeout (57014)
//! makes PL/Proxy send a cancel request with libpq's blocking `PQcancel`, which waits for the frozen
//! partition's postmaster forever. A lock timeout raises 55P03 from the same interrupt check PL/Proxy's
//! wait loop makes at least once a second; PL/Proxy then drops the call's connections without a cancel
//! request (it cancels only on 57014) and reconnects on the next call. The router's wrapper turns that
//! 55P03 into 08006 (or an allowed call, on a fail_open router). While armed, a lock wait of the router's
//! own (rare: it holds no data) would use and then clear the same timer.

use std::ffi::c_int;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::error;

/// `LOCK_TIMEOUT` of PostgreSQL's `TimeoutId` (utils/timeout.h: the third predefined reason on 13 to 18).
const LOCK_TIMEOUT: c_int = 2;

extern "C-unwind" {
    fn enable_timeout_after(id: c_int, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
}

/// Arms the router's deadline: the running statement fails with 55P03 after `milliseconds` unless
/// [`router_disarm_deadline`] runs first. 22004 for NULL, 22023 below 1.
#[pg_extern(sql = false)]
fn router_arm_deadline(milliseconds: Option<i32>) -> Result<(), ErrorReport> {
    const F: &str = "rate_limit_router.arm_deadline";
    let ms = milliseconds.ok_or_else(|| {
        error::null_argument(
            F,
            "milliseconds",
            "Pass the router's timeout in milliseconds.",
        )
    })?;
    if ms < 1 {
        return Err(error::out_of_range(
            F,
            "milliseconds",
            i64::from(ms),
            1,
            i64::from(i32::MAX),
        ));
    }
    // SAFETY: the timeout module is initialised in every backend (InitPostgres registers LOCK_TIMEOUT's
    // handler); arming a registered timeout from a function call is what the lock manager itself does.
    unsafe { enable_timeout_after(LOCK_TIMEOUT, ms) };
    Ok(())
}

/// Clears the router's deadline (nothing if it is not armed).
#[pg_extern(sql = false)]
fn router_disarm_deadline() {
    // SAFETY: disabling a registered timeout is allowed whether or not it is active.
    unsafe { disable_timeout(LOCK_TIMEOUT, false) };
}
