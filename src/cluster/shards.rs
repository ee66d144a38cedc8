//! Under Citus, a key's home: the shard of `rate_limit.bucket_state` that holds its rows, and whether this
//! node holds it.
//!
//! A delegated call runs on its key's node, and the table store then addresses that shard directly, as a
//! plain table, instead of naming the distributed table: Citus would plan each statement twice (the
//! distributed plan, then the shard query it deparses), and its local plan cache misses on every call of a
//! kept plan whose shard is pruned at execution (Citus 14.0.1 looks the cached shard plan up in the
//! original plan's empty task list). See docs/scaling.md, "Where a call runs".
//!
//! Why this is exact under shard moves and splits: Citus blocks writes to a shard before it changes where
//! the shard lives (`BlockWritesToShardList`, at the cutover of a move or split, and for the whole copy of
//! a `block_writes` move), by taking the shard's metadata lock in `ExclusiveLock` on every node; each of
//! its own writes takes that lock in `ShareLock` first (`AcquireMetadataLocks`); the lock is named by the
//! colocation group and the shard's index in it. [`local_shard`] takes the
//! same lock in the same mode, until the transaction ends, and only then checks where the shard lives:
//! - a move that reached its cutover before the lock was taken has committed its new placement, which the
//!   check reads (with the catalog snapshot, the newest one, also in REPEATABLE READ), and the call falls
//!   back to the distributed table, which Citus routes to the new node;
//! - a move that has not reached it waits for this transaction, and its logical replication carries this
//!   call's writes to the new shard before the cutover, as it carries Citus's own;
//! - a call that found its shard here, had to wait for the lock, and finds the shard gone when it gets it,
//!   was sent here before the move ended: it fails with 40001 (retry), as Citus refuses a delegated call
//!   that would reach the new node from here;
//! - so does a call Citus delegated here inside a transaction block for a key whose shard left before the
//!   call arrived (the coordinator planned it before the move committed): Citus refuses it the
//!   distributed table. Any other call for a shard that is not here goes on through the distributed
//!   table.

use std::cell::RefCell;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use super::citus_catalog;
use super::installed::citus_installed;

/// The shard of `rate_limit.bucket_state` that holds a key, and the relation name of that shard.
#[derive(Clone)]
pub struct Shard {
    /// Citus's shard id.
    pub id: i64,
    /// The shard's relation, schema-qualified and quoted (`rate_limit.bucket_state_102008`).
    pub relation: String,
    /// The colocation group of `rate_limit.bucket_state` and the shard's index among its shards: what
    /// names the shard's metadata lock.
    lock: (i32, i32),
}

/// The shard that holds `key` under Citus (see [`citus_catalog::shard_of_key`]); `None` without Citus or
/// while the state table is not hash-distributed.
pub fn shard_of(key: &str) -> Option<Shard> {
    if !citus_installed() {
        return None;
    }
    let (id, lock) = citus_catalog::shard_of_key(key)?;
    Some(Shard {
        id,
        // Citus names a shard `<table>_<shard id>` in the table's schema (`AppendShardIdToName`; the name
        // is far below NAMEDATALEN)
        relation: format!("rate_limit.bucket_state_{id}"),
        lock,
    })
}

/// Whether the state table is distributed by Citus (`rate_limit.distribute()` has run).
pub fn distributed() -> bool {
    citus_installed() && citus_catalog::is_distributed()
}

thread_local! {
    /// The last key [`local_shard`] answered for in this transaction, and its answer: valid until the
    /// transaction ends, or the subtransaction that took the shard's lock aborts (see [`forget`]), as long
    /// as the lock is held.
    static LAST: RefCell<Option<(String, Option<Shard>)>> = const { RefCell::new(None) };
}

/// Forgets the last key's shard: called at every end of a transaction and every aborted subtransaction
/// (which releases the locks it took).
pub fn forget() {
    LAST.with(|last| last.borrow_mut().take());
}

/// The shard of `key` when this node holds it, with the shard's metadata lock taken in `ShareLock` until
/// the transaction ends (see the module comment); `None` without Citus, while the state table is not
/// distributed, or when another node holds the shard (the caller then names the distributed table).
/// Remembered for the last key until the transaction ends: a call's statements ask once.
pub fn local_shard(function: &'static str, key: &str) -> Result<Option<Shard>, ErrorReport> {
    if !citus_installed() {
        return Ok(None);
    }
    let known = LAST.with(|last| match &*last.borrow() {
        Some((k, shard)) if k == key => Some(shard.clone()),
        _ => None,
    });
    if let Some(shard) = known {
        return Ok(shard);
    }
    let shard = find_local_shard(function, key)?;
    LAST.with(|last| *last.borrow_mut() = Some((key.to_string(), shard.clone())));
    Ok(shard)
}

fn find_local_shard(function: &'static str, key: &str) -> Result<Option<Shard>, ErrorReport> {
    // SAFETY: a plain global of this backend, read on its only thread.
    let seen = unsafe { pg_sys::SharedInvalidMessageCounter };
    let Some(shard) = shard_of(key) else {
        return Ok(None);
    };
    // a call that finds its shard here, waits for the lock and then finds it gone was sent here for it
    let here_before = citus_catalog::is_placed_here(shard.id);
    let waited = !lock_shard_metadata(shard.lock, false);
    if waited {
        lock_shard_metadata(shard.lock, true);
    }
    // SAFETY: processes pending invalidation messages, as PostgreSQL does after taking a relation's lock;
    // called outside any catalog scan, on the backend's only thread.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    // SAFETY: as above.
    let same_shard = if unsafe { pg_sys::SharedInvalidMessageCounter } != seen {
        // the metadata may have changed before the lock was taken (a split gives the key another shard)
        matches!(shard_of(key), Some(now) if now.id == shard.id)
    } else {
        true
    };
    let here = same_shard && citus_catalog::is_placed_here(shard.id);
    if !here && (waited && here_before || citus_refuses_the_distributed_table()) {
        return Err(moved_while_waiting(function, key));
    }
    Ok(here.then_some(shard))
}

/// Whether Citus would refuse this call the distributed table, with XX000 ("cannot execute a distributed
/// query from a query on a shard"): in a backend Citus opened (its connections name themselves
/// `citus_internal gpid=…`, which Citus reads as "maybe a task on a shard"), inside a transaction block,
/// unless `citus.allow_nested_distributed_execution` is on. That is a call Citus delegated here inside a
/// transaction block (`force_delegation` allows nothing more there), for a key whose shard left after the
/// coordinator planned it: 40001 sends the retry to the new node. Outside a transaction block Citus lets a
/// delegated call reach other nodes, and the call goes on through the distributed table.
fn citus_refuses_the_distributed_table() -> bool {
    // SAFETY: IsTransactionBlock reads this backend's transaction state, on its only thread.
    if !unsafe { pg_sys::IsTransactionBlock() } {
        return false;
    }
    setting("citus.allow_nested_distributed_execution").as_deref() != Some("on")
        && setting("application_name")
            .is_some_and(|name| name.starts_with(CITUS_INTERNAL_APPLICATION_NAME))
}

/// The prefix of the application name of Citus's own connections (`CITUS_APPLICATION_NAME_PREFIX`).
const CITUS_INTERNAL_APPLICATION_NAME: &str = "citus_internal gpid=";

/// The current value of the setting `name`, as text; `None` when there is no such setting.
fn setting(name: &str) -> Option<String> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: GetConfigOption with missing_ok returns NULL for an unknown setting instead of raising an
    // error; the name is a valid C string; a non-NULL result is a NUL-terminated string that stays valid
    // until the setting changes, and is copied at once.
    unsafe {
        let value = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!value.is_null()).then(|| {
            std::ffi::CStr::from_ptr(value)
                .to_string_lossy()
                .into_owned()
        })
    }
}

/// 40001: the key's shard moved (or split) while this call waited for the move's cutover. Citus sent the
/// call here before the move ended, and a call it delegated cannot reach the new node from here (Citus
/// refuses a distributed query nested in a delegated call, with XX000): the retry goes to the new node.
fn moved_while_waiting(function: &'static str, key: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        format!(
            "the shard of key {} moved to another node while this call waited for the move",
            crate::error::quoted(key)
        ),
        function,
    )
    .set_detail("Nothing was taken or changed.")
    .set_hint("Retry the call: it goes to the key's new node.")
}

/// Takes Citus's metadata lock of a shard in `ShareLock` until the transaction ends, as Citus's own writes
/// do (`LockShardDistributionMetadata`). For a hash-distributed table Citus names the lock by the table's
/// colocation group and the shard's index in it, so that one lock covers a shard and the shards colocated
/// with it (`SET_LOCKTAG_COLOCATED_SHARDS_METADATA_RESOURCE`): an advisory-type tag of this database, the
/// index, the group, and Citus's class 8, a class that SQL's advisory lock functions (classes 1 and 2)
/// cannot name.
/// Returns whether the lock was taken: always when `wait`, else only if it was free.
fn lock_shard_metadata((colocation, index): (i32, i32), wait: bool) -> bool {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: crate::backend::current_database(),
        locktag_field2: index as u32,
        locktag_field3: colocation as u32,
        locktag_field4: CITUS_COLOCATED_SHARDS_METADATA,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: USER_LOCKMETHOD,
    };
    // SAFETY: `tag` is a fully initialised LOCKTAG; LockAcquire copies it. A transaction-level lock
    // (sessionLock false) is released by PostgreSQL when the transaction ends; with `wait` it may wait, as
    // Citus's own statement would, for a shard move's cutover, else it returns at once.
    let result =
        unsafe { pg_sys::LockAcquire(&tag, pg_sys::ShareLock as pg_sys::LOCKMODE, false, !wait) };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Citus's advisory lock class of colocated shards' metadata
/// (`ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA`).
const CITUS_COLOCATED_SHARDS_METADATA: u16 = 8;

/// PostgreSQL's lock method of advisory locks (`USER_LOCKMETHOD` in `lock.h`, which `SET_LOCKTAG_ADVISORY`
/// sets): a tag with another method would be another lock, and would not wait for a move.
const USER_LOCKMETHOD: u8 = 2;
