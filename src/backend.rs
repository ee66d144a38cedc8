//! A leaf of facts about this backend that several modules need: the database it is connected to, its
//! session's login role. It imports none of the modules that use it.

use pgrx::pg_sys;

/// The OID of the database this backend is connected to.
pub fn current_database() -> u32 {
    // SAFETY: MyDatabaseId is a plain global of the backend, set once it connected and read on its only
    // thread.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// The OID of the session's login role (which `SET ROLE` and security-definer functions do not change):
/// whose buckets the role share counts.
pub fn current_role() -> u32 {
    // SAFETY: called in a backend of a connected session, where the session user is set at start and read
    // on the backend's only thread.
    unsafe { pg_sys::GetSessionUserId() }.to_u32()
}
