//! Which (database, policy, key) may have an override: a Bloom filter in shared memory, so that a call of a
//! key without one, in a policy with a million overrides, reads no row (a key's probe of the table, about
//! 15 µs of a call's 30, is paid only by the keys that may have one and by the few false positives).
//!
//! Locking contract: none. The filter is an array of 64-bit words set with atomic OR and read with atomic
//! loads; bits are only ever set (until the server restarts), so a reader sees either a bit or not, never
//! a torn state. Correctness rests on one order:
//! - every write of an override sets its key's bits *before* its transaction commits (the row trigger of
//!   `rate_limit.key_overrides`, `rate_limit.policies_changed`, fires for every insert and update,
//!   whoever makes it), so a reader whose snapshot sees a committed override finds its bits set: the
//!   snapshot was taken after the commit, which followed the bits (both pass through locks, which are
//!   full barriers);
//! - a database's filter is used only once it is *ready*: a build (by the first call that needs it after
//!   the server started) marks it building, reads every override of the database with a snapshot taken
//!   after that mark, sets their bits and marks it ready. An override committed before that snapshot is
//!   read; one written later (or by a transaction still open then) sets its own bits when written.
//!
//! Not used (every call of a policy with overrides then reads its key's row, as the filter's "maybe"
//! would): without preloading, during recovery (a standby replays overrides without their trigger), under
//! Citus (the rows are written on every node by Citus), for more than [`DATABASES`] databases, or with
//! `rate_limit.override_filter_mb = 0`. Deleted overrides keep their bits until the server restarts: false
//! positives cost a read, never a wrong answer.

use std::cell::Cell;
use std::ffi::CStr;
use std::hash::Hasher;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{Spi, SpiError};
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::cluster::installed::citus_installed;
use crate::error;
use crate::gucs;
use crate::policies::with_latest_snapshot;
use crate::shmem;

const SEGMENT_NAME: &CStr = c"rate_limit overrides filter";

/// Databases whose filter can be kept (a database beyond reads every key).
pub const DATABASES: usize = 64;

/// Bits set per (database, policy, key).
const HASHES: u64 = 3;

/// A database's state in the filter.
const EMPTY: u32 = 0;
const BUILDING: u32 = 1;
const READY: u32 = 2;

/// One database's slot: its oid and state.
#[repr(C)]
struct Database {
    oid: AtomicU32,
    state: AtomicU32,
}

/// The segment's header, followed by `words` words of bits.
#[repr(C)]
struct Header {
    seed: [u64; 2],
    words: u64,
    databases: [Database; DATABASES],
}

/// The segment, once attached (null: no filter in this server).
static mut SEGMENT: *mut Header = ptr::null_mut();

thread_local! {
    /// The slot this backend is building, to be emptied if its transaction aborts.
    static BUILDING_SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The words of bits `rate_limit.override_filter_mb` asks for.
fn words() -> u64 {
    u64::try_from(gucs::override_filter_mb().max(0)).unwrap_or(0) * 1024 * 1024 / 8
}

fn bytes() -> usize {
    size_of::<Header>() + usize::try_from(words()).unwrap_or(0) * size_of::<u64>()
}

/// Requests the segment's space (none with a size of 0).
///
/// # Safety
/// Only in the postmaster while shared memory may still be requested.
pub unsafe fn request() {
    if words() > 0 {
        // SAFETY: the caller's contract.
        unsafe { shmem::request(bytes(), None) };
    }
}

/// Creates the segment or finds it, in the shared-memory startup hook.
///
/// # Safety
/// Only from the shmem startup hook, with AddinShmemInitLock held and the space requested.
pub unsafe fn attach() {
    let words = words();
    if words == 0 {
        return;
    }
    // SAFETY: the caller's contract; a created segment is zeroed by `attach` (every database EMPTY, every
    // bit clear) and its seed and size are written before AddinShmemInitLock is released.
    unsafe {
        let (segment, created) = shmem::attach(SEGMENT_NAME, bytes());
        let header = segment.cast::<Header>();
        if created {
            (*header).seed = shmem::random_seed();
            (*header).words = words;
        }
        SEGMENT = header;
    }
}

/// The header, when the filter exists in this server.
fn header() -> Option<&'static Header> {
    // SAFETY: SEGMENT is written once per process in the startup hook (inherited by backends) and then
    // only read; it points at a segment that lives as long as the server.
    unsafe { SEGMENT.as_ref() }
}

/// The bits of `words` 64-bit words that follow `header`.
fn bits(header: &'static Header) -> &'static [AtomicU64] {
    // SAFETY: the segment holds `words` words right after the header (see `bytes`), zeroed at creation,
    // only ever accessed atomically.
    unsafe {
        std::slice::from_raw_parts(
            ptr::from_ref(header).add(1).cast::<AtomicU64>(),
            usize::try_from(header.words).unwrap_or(0),
        )
    }
}

/// The bit positions of (database, policy, key).
fn positions(header: &Header, database: u32, policy: &str, key: &str) -> [u64; HASHES as usize] {
    let mut h = SipHasher13::new_with_keys(header.seed[0], header.seed[1]);
    h.write_u32(database);
    h.write(policy.as_bytes());
    h.write_u8(0xff); // no policy name holds 0xff: the pair is unambiguous
    h.write(key.as_bytes());
    let hash = h.finish128();
    let m = header.words * 64;
    let mut out = [0; HASHES as usize];
    for (i, p) in out.iter_mut().enumerate() {
        *p = hash.h1.wrapping_add((i as u64).wrapping_mul(hash.h2 | 1)) % m;
    }
    out
}

/// Sets the bits of an override of `key` under `policy` in this database (called for every insert and
/// update of `rate_limit.key_overrides`, before its transaction commits).
pub fn add(policy: &str, key: &str) {
    let Some(header) = header() else { return };
    let bits = bits(header);
    let database = crate::backend::current_database();
    for p in positions(header, database, policy, key) {
        bits[(p / 64) as usize].fetch_or(1 << (p % 64), Ordering::SeqCst);
    }
}

/// Whether an override of `key` under `policy` may exist in this database: `Some(false)` when surely not,
/// `Some(true)` when it may (read the row), `None` when the filter cannot say (not in use here, or this
/// database's filter could not be made ready).
pub fn may_have(
    function: &'static str,
    policy: &str,
    key: &str,
) -> Result<Option<bool>, ErrorReport> {
    let Some(header) = header() else {
        return Ok(None);
    };
    let database = crate::backend::current_database();
    // SAFETY: a plain read of shared state set at start.
    let recovering = unsafe { pg_sys::RecoveryInProgress() };
    if recovering || citus_installed() || !ready(function, header, database)? {
        return Ok(None);
    }
    let bits = bits(header);
    Ok(Some(positions(header, database, policy, key).iter().all(
        |&p| bits[(p / 64) as usize].load(Ordering::SeqCst) & (1 << (p % 64)) != 0,
    )))
}

/// Whether `database`'s filter is ready; builds it first if nobody has (one call per database and server
/// start reads every override of the database, about a second per million).
fn ready(function: &'static str, header: &Header, database: u32) -> Result<bool, ErrorReport> {
    let slots = &header.databases;
    if let Some(slot) = slots
        .iter()
        .find(|s| s.oid.load(Ordering::Acquire) == database)
    {
        return Ok(slot.state.load(Ordering::Acquire) == READY);
    }
    // claim an empty slot for this database; a concurrent claim of the same database by another backend
    // leaves two slots for it, of which the first found is used (both end ready)
    let Some(index) = slots.iter().position(|s| {
        s.state
            .compare_exchange(EMPTY, BUILDING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }) else {
        return Ok(false);
    };
    slots[index].oid.store(database, Ordering::Release);
    BUILDING_SLOT.with(|b| b.set(Some(index)));
    build(function)?;
    slots[index].state.store(READY, Ordering::Release);
    BUILDING_SLOT.with(|b| b.set(None));
    Ok(true)
}

/// Sets the bits of every override of this database, read with a snapshot taken now (after the slot was
/// marked building).
fn build(function: &'static str) -> Result<(), ErrorReport> {
    with_latest_snapshot(|| {
        super::read::as_table_owner(function, || {
            Spi::connect(|client| {
                // in batches, through a cursor: a million overrides are never held at once
                let mut cursor = client.open_cursor(
                    "SELECT o.policy, o.key FROM rate_limit.key_overrides AS o",
                    &[],
                );
                loop {
                    let rows = cursor.fetch(10_000)?;
                    if rows.is_empty() {
                        return Ok::<_, SpiError>(());
                    }
                    for row in rows {
                        if let (Some(policy), Some(key)) =
                            (row.get::<String>(1)?, row.get::<String>(2)?)
                        {
                            add(&policy, &key);
                        }
                    }
                }
            })
            .map_err(|e| error::internal(function, e))
        })
    })
}

/// At the end of a transaction that aborted while building a database's filter: the slot is emptied, so
/// that a later call builds it again.
pub fn on_abort() {
    let Some(index) = BUILDING_SLOT.with(|b| b.take()) else {
        return;
    };
    if let Some(header) = header() {
        let slot = &header.databases[index];
        slot.oid.store(0, Ordering::Release);
        slot.state.store(EMPTY, Ordering::Release);
    }
}
