//! Whether Citus is installed in the current database, asked on every call's path under Citus: remembered
//! until the catalogs change.

use std::cell::Cell;

use pgrx::pg_sys;

thread_local! {
    /// Whether the Citus library is loaded, once known for good: Citus works only from
    /// `shared_preload_libraries` (it refuses a later `LOAD`), and a backend runs SQL only after the
    /// preloaded libraries are loaded, so the answer never changes in a backend, loaded or not.
    static LOADED: Cell<Option<bool>> = const { Cell::new(None) };
    /// Whether the Citus extension exists, as found when `SharedInvalidMessageCounter` had the value kept
    /// with it: creating or dropping an extension changes catalogs that send invalidations (its functions,
    /// its schema), so the answer holds while the counter has not moved.
    static INSTALLED: Cell<Option<(u64, bool)>> = const { Cell::new(None) };
}

/// Whether the Citus extension exists in the current database. First whether the Citus library is loaded
/// at all (a setting it defines exists: a hash lookup, once per backend), so that a server without Citus
/// pays nothing; then
/// a catalog lookup (a scan of pg_extension, no query), again only when the catalogs changed.
pub fn citus_installed() -> bool {
    let loaded = LOADED.with(Cell::get).unwrap_or_else(|| {
        let loaded = citus_loaded();
        // SAFETY: a plain global of this process, read on its only thread. Under the postmaster (a
        // backend or a background worker) the preloaded libraries were loaded before any SQL ran; in a
        // single-user server the answer is simply asked again on every call.
        if unsafe { pg_sys::IsUnderPostmaster } {
            LOADED.with(|c| c.set(Some(loaded)));
        }
        loaded
    });
    if !loaded {
        return false;
    }
    // SAFETY: a plain global of this backend, read on its only thread.
    let seen = unsafe { pg_sys::SharedInvalidMessageCounter };
    if let Some((at, installed)) = INSTALLED.with(Cell::get) {
        if at == seen {
            return installed;
        }
    }
    let installed = citus_extension_exists();
    INSTALLED.with(|c| c.set(Some((seen, installed))));
    installed
}

pub(super) fn citus_loaded() -> bool {
    // SAFETY: GetConfigOption with missing_ok returns NULL for an unknown setting instead of raising an
    // error; the name is a valid C string; the result is only compared with NULL.
    unsafe { !pg_sys::GetConfigOption(c"citus.shard_count".as_ptr(), true, false).is_null() }
}

pub(super) fn citus_extension_exists() -> bool {
    // SAFETY: get_extension_oid reads pg_extension inside the current transaction; with missing_ok it
    // returns InvalidOid instead of raising an error.
    unsafe { pg_sys::get_extension_oid(c"citus".as_ptr(), true) != pg_sys::InvalidOid }
}
