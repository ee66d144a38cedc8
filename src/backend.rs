//! A leaf of facts about this backend that several modules need: the database it is connected to, its
//! session's login role, a function's owner, and running code as another role (as SECURITY DEFINER
//! does). It imports none of the modules that use it.

use std::cell::Cell;

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

thread_local! {
    /// The function whose owner [`function_owner`] looked up last, and that owner: forgotten whenever the
    /// catalog cache of functions is invalidated ([`register_owner_invalidation`]).
    static LAST_OWNER: Cell<Option<(pg_sys::Oid, pg_sys::Oid)>> = const { Cell::new(None) };
}

/// Registers the catalog-cache callback that forgets the owner [`function_owner`] remembers. Called once
/// per backend from `_PG_init`.
pub fn register_owner_invalidation() {
    // SAFETY: registering a callback is allowed at any time in a backend; the function lives as long as
    // the library, which is never unloaded, and ignores its arguments.
    unsafe {
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            Some(forget_owner),
            pg_sys::Datum::from(0usize),
        );
    }
}

/// Forgets the remembered owner: a function's row changed, or every catalog cache was reset. PostgreSQL
/// calls it wherever the catalog cache itself learns of the change (the changing backend at its next
/// command, every other one when it accepts the invalidation), so the remembered owner is never older
/// than the catalog cache's row would be.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_owner(_arg: pg_sys::Datum, _cache: std::ffi::c_int, _hash: u32) {
    LAST_OWNER.with(|last| last.set(None));
}

/// The owner of function `oid`, from the catalog cache (no statement, so a hot standby reads it too);
/// `None` when there is no such function. The last function's owner is remembered until the cache of
/// functions is invalidated: `rate_limit.allow` asks for its own at every execution of a prepared
/// statement, where a catalog lookup costs about 500 instructions.
pub fn function_owner(oid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    if let Some((function, owner)) = LAST_OWNER.with(Cell::get) {
        if function == oid {
            return Some(owner);
        }
    }
    let owner = owner_in_catalog(oid)?;
    LAST_OWNER.with(|last| last.set(Some((oid, owner))));
    Some(owner)
}

/// [`function_owner`] read from the catalog cache.
fn owner_in_catalog(oid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    // SAFETY: a catalog-cache lookup by oid inside a transaction; the tuple's proowner is read while it is
    // held and the tuple released before return.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(oid),
        );
        if tuple.is_null() {
            return None;
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple)).proowner;
        pg_sys::ReleaseSysCache(tuple);
        Some(owner)
    }
}

/// Runs `f` as role `user`: the current user id is `user` while `f` runs (with
/// `SECURITY_LOCAL_USERID_CHANGE`, so `f` cannot `SET ROLE` away), then what it was. This is what a
/// SECURITY DEFINER function's call does (`fmgr_security_definer`), and what PostgreSQL's
/// referential-integrity triggers do around their queries (ri_triggers.c); nothing to do when `user` is
/// the current user already. The session user, whose shares [`current_role`] counts, is not changed.
pub fn as_user<T>(user: pg_sys::Oid, f: impl FnOnce() -> T) -> T {
    let (mut current, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: reads the current user id and security context, plain globals of the backend, into the two
    // locals.
    unsafe { GetUserIdAndSecContext(&mut current, &mut context) };
    if current == user {
        return f();
    }
    // SAFETY: setting the current user id and security context, as ri_triggers.c does. An error inside
    // `f` aborts the (sub)transaction, which restores both (AbortTransaction / AbortSubTransaction, to
    // what they were when it started); on return they are restored here.
    unsafe {
        SetUserIdAndSecContext(user, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
    }
    let result = f();
    // SAFETY: restores what was read above.
    unsafe { SetUserIdAndSecContext(current, context) };
    result
}

// The two functions of miscinit.c that read and set the current user id, declared here without pgrx's
// guard (a `sigsetjmp` for every call, there to turn an ERROR into a Rust panic): they only copy globals
// and never raise an error, so no guard is needed; `rate_limit.allow` calls them on every call.
unsafe extern "C" {
    fn GetUserIdAndSecContext(userid: *mut pg_sys::Oid, sec_context: *mut std::ffi::c_int);
    fn SetUserIdAndSecContext(userid: pg_sys::Oid, sec_context: std::ffi::c_int);
}
