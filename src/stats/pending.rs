//! This backend's denials not yet added to the shared summaries: the batching rule is the model's
//! ([`rate_limit_model::denials`]); this keeps the backend's one pending batch and hands batches to the
//! summary under its spin lock, at a denial, at the end of a transaction, and at exit.

use std::cell::{Cell, RefCell};

use pgrx::pg_sys;

use super::segment::Stats;
use crate::time::clock;
use rate_limit_model::denials::{self, Batch};

thread_local! {
    static PENDING: RefCell<Option<Batch>> = const { RefCell::new(None) };
    static EXIT_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Counts a denial of `key` in summary `entry` at `now`; adds a batch to the summary when one is due.
pub(super) fn note_denial(stats: &Stats, entry: u32, key: &str, now: i64) {
    let hash = stats.key_hash(key);
    let due = PENDING.with(|cell| denials::note(&mut cell.borrow_mut(), entry, hash, key, now));
    if !EXIT_HOOK.with(|h| h.replace(true)) {
        // SAFETY: registering an exit callback is allowed at any time in a backend; the function lives as
        // long as the library, which is never unloaded.
        unsafe { pg_sys::before_shmem_exit(Some(flush_at_exit), pg_sys::Datum::from(0)) };
    }
    if let Some(batch) = due {
        add_to_summary(stats, batch);
    }
}

fn add_to_summary(stats: &Stats, batch: Batch) {
    stats
        .entry(batch.entry)
        .with_summary(|summary| summary.record(batch.hash, batch.key.as_bytes(), batch.count));
}

/// Adds this backend's pending denials to the summary now.
pub(super) fn flush_pending(stats: &Stats) {
    if let Some(batch) = PENDING.with(|cell| cell.borrow_mut().take()) {
        add_to_summary(stats, batch);
    }
}

/// At the end of a transaction: adds the pending denials if they are due. Reads the clock only when
/// denials are pending.
pub fn flush_if_due() {
    if PENDING.with(|cell| cell.borrow().is_none()) {
        return;
    }
    let Some(stats) = Stats::attach() else {
        return;
    };
    let now = clock::now_us();
    if PENDING.with(|cell| cell.borrow().as_ref().is_some_and(|b| b.due(now))) {
        flush_pending(&stats);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn flush_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if let Some(stats) = Stats::attach() {
        flush_pending(&stats);
    }
}
