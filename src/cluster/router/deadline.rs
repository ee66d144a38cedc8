//! The PL/Proxy router's deadline (`router/plproxy.sql`): every forwarded call ends within the router's
//! `timeout`, even when a partition stops answering without closing its connections (a frozen process, a
//! host that stopped). Armed by the forwarder ([`super::forward`]) and by three C functions the router file
//! declares; not part of the extension's SQL (the router database does not have the extension).
//!
//! Why PostgreSQL's lock timeout: PL/Proxy 2.10-2.12 check their own `query_timeout` only when a
//! partition's socket has an event, which a frozen partition never gives, and a statement timeout (57014)
//! makes PL/Proxy send a cancel request with libpq's blocking `PQcancel`, which waits for the frozen
//! partition's postmaster forever. A lock timeout raises 55P03 from the same interrupt check PL/Proxy's
//! wait loop makes at least once a second; PL/Proxy then gives up the call's connections without a cancel
//! request (it cancels only on 57014) and reconnects on the next call. The router's wrapper turns that
//! 55P03 into 08006 (or an allowed call, on a fail_open router) when [`router_deadline_passed`] says it
//! was the deadline's, not a lock timeout of the caller's own.
//!
//! How long a deadline lives: from [`router_arm_deadline`] to the end of the (sub)transaction that armed it,
//! whichever way it ends, or an earlier [`router_disarm_deadline`]. A wrapper arms it inside its own
//! `BEGIN … EXCEPTION` block, a subtransaction, so the deadline ends with the forwarded call, and nothing
//! a session arms (a direct call of `arm_deadline` included) outlives its transaction: COMMIT, ROLLBACK,
//! PREPARE TRANSACTION and DISCARD ALL (which runs in a transaction of its own) never leave it running
//! for a pooler's next client. [`on_transaction_end`] and [`on_subtransaction_end`] are called from the
//! library's transaction callbacks (`lib.rs`).

use std::cell::Cell;
use std::ffi::c_int;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::error;

/// `LOCK_TIMEOUT` of PostgreSQL's `TimeoutId` (utils/timeout.h: the third predefined reason on 13 to 18).
const LOCK_TIMEOUT: c_int = 2;

extern "C-unwind" {
    fn enable_timeout_after(id: c_int, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
}

/// The deadline this backend armed and has not cleared: the subtransaction that armed it.
#[derive(Clone, Copy)]
struct Armed {
    subtransaction: pg_sys::SubTransactionId,
}

thread_local! {
    /// The armed deadline, if any.
    static ARMED: Cell<Option<Armed>> = const { Cell::new(None) };
    /// When the last deadline armed in this transaction was to pass (µs on the server clock; 0: none).
    static LAST_END: Cell<i64> = const { Cell::new(0) };
}

/// Clears the armed deadline, if any (the lock timeout of PostgreSQL's own lock waits is left alone when
/// this backend armed none).
pub(super) fn disarm() {
    if ARMED.with(|a| a.take()).is_some() {
        // SAFETY: disabling a registered timeout is allowed whether or not it is active, in or out of a
        // transaction.
        unsafe { disable_timeout(LOCK_TIMEOUT, false) };
    }
}

/// At every end of a transaction (commit, abort, prepare): no deadline outlives it.
pub fn on_transaction_end() {
    disarm();
    LAST_END.with(|e| e.set(0));
}

/// At the end (commit or abort) of subtransaction `ended`: a deadline it armed ends with it.
pub fn on_subtransaction_end(ended: pg_sys::SubTransactionId) {
    if ARMED
        .with(Cell::get)
        .is_some_and(|a| a.subtransaction == ended)
    {
        disarm();
    }
}

/// Arms the router's deadline: the running statement fails with 55P03 after `milliseconds`, unless the
/// (sub)transaction that armed it ends first or [`router_disarm_deadline`] runs. 22004 for NULL, 22023
/// below 1.
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
    arm(ms);
    Ok(())
}

/// Arms the deadline `ms` (at least 1) milliseconds from now, in the current subtransaction.
pub(super) fn arm(ms: i32) {
    // SAFETY: inside a transaction (a function call); reads the current subtransaction's id and the clock.
    let (subtransaction, now) = unsafe {
        (
            pg_sys::GetCurrentSubTransactionId(),
            pg_sys::GetCurrentTimestamp(),
        )
    };
    ARMED.with(|a| a.set(Some(Armed { subtransaction })));
    LAST_END.with(|e| e.set(now.saturating_add(i64::from(ms) * 1000)));
    // SAFETY: the timeout module is initialised in every backend (InitPostgres registers LOCK_TIMEOUT's
    // handler); arming a registered timeout from a function call is what the lock manager itself does.
    unsafe { enable_timeout_after(LOCK_TIMEOUT, ms.max(1)) };
}

/// Clears the router's deadline (nothing if it is not armed).
#[pg_extern(sql = false)]
fn router_disarm_deadline() {
    disarm();
}

/// Whether the last deadline armed in this transaction has passed: a 55P03 then is the deadline's, not a
/// lock timeout of the caller's own (`lock_timeout`) that happened first.
#[pg_extern(sql = false)]
fn router_deadline_passed() -> bool {
    passed()
}

/// Whether the last deadline armed in this transaction has passed.
pub(super) fn passed() -> bool {
    let end = LAST_END.with(Cell::get);
    // SAFETY: reads the clock.
    end != 0 && unsafe { pg_sys::GetCurrentTimestamp() } >= end
}
