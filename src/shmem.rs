//! A leaf of facts and helpers about shared memory, used by the memory store and the statistics alike:
//! whether the library was preloaded, the keyed hashes' random seed, and one way to request and create a
//! named segment. It imports none of the modules that use it; the hooks that call them are in
//! [`crate::hooks`].

use std::ffi::CStr;
use std::ptr;

use pgrx::pg_sys;

/// Whether `_PG_init` ran while preloading (only then is there shared memory of ours).
static mut PRELOADED: bool = false;

/// Whether the library was preloaded, so that shared memory exists.
pub fn preloaded() -> bool {
    // SAFETY: PRELOADED is written only in _PG_init, in the postmaster before any backend is forked.
    unsafe { PRELOADED }
}

/// Records that the library is being preloaded.
///
/// # Safety
/// Only from `_PG_init` in the postmaster, single-threaded, before any backend is forked.
pub unsafe fn set_preloaded() {
    // SAFETY: the caller's contract: no other thread or process reads it yet.
    unsafe { PRELOADED = true };
}

/// Requests `bytes` of shared memory and, if given, a named tranche of `locks` LWLocks.
///
/// # Safety
/// Only in the postmaster while shared memory may still be requested.
pub unsafe fn request(bytes: usize, tranche: Option<(&'static CStr, u32)>) {
    // SAFETY: the caller guarantees the request phase; the tranche name is a static C string.
    unsafe {
        pg_sys::RequestAddinShmemSpace(bytes);
        if let Some((name, locks)) = tranche {
            pg_sys::RequestNamedLWLockTranche(name.as_ptr(), locks as i32);
        }
    }
}

/// Finds the segment `name` of `bytes` bytes, or creates it zeroed; returns it and whether it was created
/// (then its creator initialises it before releasing AddinShmemInitLock).
///
/// # Safety
/// Only from the shmem startup hook, with AddinShmemInitLock held and the space requested.
pub unsafe fn attach(name: &'static CStr, bytes: usize) -> (*mut u8, bool) {
    let mut found = false;
    // SAFETY: the caller holds AddinShmemInitLock, as pg_stat_statements does; a new segment is zeroed
    // before anyone else can see it (the lock is held until its creator has initialised it).
    unsafe {
        let segment = pg_sys::ShmemInitStruct(name.as_ptr(), bytes, &mut found).cast::<u8>();
        if !found {
            ptr::write_bytes(segment, 0, bytes);
        }
        (segment, !found)
    }
}

/// A random 128-bit key for the keyed hashes of shared memory; from the clock and the pid if the system
/// has no strong randomness (still keyed, never a fixed key).
pub fn random_seed() -> [u64; 2] {
    let mut seed = [0u64; 2];
    // SAFETY: pg_strong_random writes exactly the given number of bytes into the buffer.
    let ok = unsafe { pg_sys::pg_strong_random(seed.as_mut_ptr().cast(), size_of_val(&seed)) };
    if !ok {
        // the system's clock in nanoseconds, read directly so that this leaf imports nothing of the crate
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        seed = [now, u64::from(std::process::id()).rotate_left(32)];
    }
    seed
}
