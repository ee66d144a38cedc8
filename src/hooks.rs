//! The shared-memory hooks when the library is preloaded: one place that chains PostgreSQL's hooks and calls
//! each user of shared memory (the memory store, the statistics) in turn.
//!
//! - request phase (`shmem_request_hook` from PostgreSQL 15, `_PG_init` itself on 13): each requests its
//!   space and locks;
//! - startup (`shmem_startup_hook`, in the postmaster at start and after every crash-restart): each creates
//!   or finds its segment under AddinShmemInitLock, and a segment just created loads what a clean shutdown
//!   saved (the clock shift: what a promotion saved);
//! - clean shutdown (`on_shmem_exit` in the postmaster, exit code 0): each saves its state to a file in the
//!   data directory. A crash (non-zero code, or a killed postmaster) saves nothing.

use pgrx::pg_sys;

use crate::policies::overrides::filter as overrides_filter;
use crate::shmem;
use crate::stats;
use crate::store;
use crate::time::clock_shift;

/// Index of AddinShmemInitLock in MainLWLockArray (lwlocknames.txt, the same from PostgreSQL 13 to 18).
const ADDIN_SHMEM_INIT_LOCK: usize = 21;

static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;
#[cfg(not(any(feature = "pg13", feature = "pg14")))]
static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;

/// Installs the hooks. Called from `_PG_init` only while preloading.
pub fn init_when_preloading() {
    // SAFETY: _PG_init runs once, single-threaded, in the postmaster; the hooks are process globals that
    // PostgreSQL expects extensions to chain exactly like this.
    unsafe {
        shmem::set_preloaded();
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        request_all();
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(shmem_request);
        }
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

/// # Safety
/// Only in the postmaster while shared memory may still be requested.
unsafe fn request_all() {
    // SAFETY: the caller's contract is theirs.
    unsafe {
        store::request_memory();
        stats::request_shmem();
        clock_shift::request_shmem();
        overrides_filter::request();
    }
}

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: called by the postmaster in its shmem request phase; the previous hook was saved by
    // init_when_preloading and is called first, as every extension does.
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            prev();
        }
        request_all();
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: called by the postmaster with shared memory set up; the segments are created or found under
    // AddinShmemInitLock, as pg_stat_statements does. The exit callback is registered once, in the
    // postmaster (not under it), where the segments outlive every backend.
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK {
            prev();
        }
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(ADDIN_SHMEM_INIT_LOCK)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let memory_created = store::attach_memory();
        let stats_created = stats::attach_or_create();
        clock_shift::attach_or_create();
        overrides_filter::attach();
        pg_sys::LWLockRelease(init_lock);
        if !pg_sys::IsUnderPostmaster {
            if memory_created {
                store::load_memory();
            }
            if stats_created {
                stats::load_saved();
            }
            pg_sys::on_shmem_exit(Some(shmem_exit), pg_sys::Datum::from(0));
        }
    }
}

/// Saves the state of a clean shutdown; nothing after a crash (the state may be inconsistent).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_exit(code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if code != 0 {
        return;
    }
    store::save_memory();
    stats::save();
}
