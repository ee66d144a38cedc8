//! The statistics' shared-memory segment: its layout (header, open-addressing index, entries of striped
//! counters with a denied-keys summary each), its creation, and finding or creating the entry of a
//! (database, namespace). The locking contract is in [`super`].

use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::hash::Hasher;
use std::ptr;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;
use siphasher::sip::SipHasher13;

use super::purges::Records;
use crate::gucs;
use crate::time::clock;
use rate_limit_model::summary::Summary;

const SEGMENT_NAME: &CStr = c"rate_limit statistics";
const TRANCHE_NAME: &CStr = c"rate_limit statistics";

/// Cache lines of counters per entry.
pub const STRIPES: usize = 8;

/// The longest namespace name: a policy name (63 bytes) or `#request` / `#ad_hoc`.
pub(super) const NAME_BYTES: usize = 64;

/// One cache line of counters.
#[repr(C, align(64))]
#[derive(Default)]
pub(super) struct Stripe {
    pub(super) calls: AtomicU64,
    pub(super) granted: AtomicU64,
    pub(super) denied: AtomicU64,
    pub(super) tokens: AtomicU64,
    pub(super) shadow_denied: AtomicU64,
    pub(super) blocked: AtomicU64,
}

/// The statistics of one (database, namespace).
#[repr(C)]
pub(super) struct Entry {
    /// Written before the entry is published, then read-only.
    pub(super) database: u32,
    pub(super) name_len: u32,
    pub(super) name: [u8; NAME_BYTES],
    /// Wall clock (µs since 2000-01-01) of the entry's creation or last reset.
    pub(super) since: AtomicI64,
    /// Wall clock of the last denial; 0 if none.
    pub(super) last_denial: AtomicI64,
    /// Spin lock of `summary`: 0 free, 1 held.
    pub(super) summary_lock: AtomicU32,
    pub(super) stripes: [Stripe; STRIPES],
    pub(super) summary: UnsafeCell<Summary>,
}

/// The segment's header, followed by the index and the entries.
#[repr(C)]
pub(super) struct Header {
    /// Key of the hashes (namespace lookup, key identity in summaries).
    pub(super) seed: [u64; 2],
    pub(super) capacity: u32,
    /// A power of two, at least twice `capacity`.
    pub(super) index_len: u32,
    /// Entries in use (the first `used` of the array).
    pub(super) used: AtomicU32,
    /// Calls of namespaces that found no free entry.
    pub(super) untracked: AtomicU64,
    pub(super) lock: *mut pg_sys::LWLock,
    /// The background worker's last purges (not saved across restarts).
    pub(super) purges: Records,
}

/// Offsets of the segment's parts.
pub(super) struct Layout {
    pub(super) capacity: u32,
    pub(super) index_len: u32,
}

impl Layout {
    pub(super) fn for_capacity(capacity: u32) -> Layout {
        Layout {
            capacity,
            index_len: (capacity.max(1) * 2).next_power_of_two(),
        }
    }

    pub(super) fn index_offset() -> usize {
        size_of::<Header>().next_multiple_of(64)
    }

    pub(super) fn entries_offset(&self) -> usize {
        (Self::index_offset() + self.index_len as usize * size_of::<AtomicU32>())
            .next_multiple_of(64)
    }

    pub(super) fn bytes(&self) -> usize {
        self.entries_offset() + self.capacity as usize * size_of::<Entry>()
    }
}

/// The segment, once attached; copied into every backend by fork.
pub(super) static mut SEGMENT: *mut Header = ptr::null_mut();

pub(super) fn layout() -> Layout {
    Layout::for_capacity(gucs::stats_max().max(1) as u32)
}

/// Requests the segment and its lock ([`crate::hooks`] calls it in the request phase).
///
/// # Safety
/// Only in the postmaster while shared memory may still be requested.
pub unsafe fn request_shmem() {
    // SAFETY: the caller guarantees we are in the request phase; the name is a static C string.
    unsafe { crate::shmem::request(layout().bytes(), Some((TRANCHE_NAME, 1))) }
}

/// Creates or finds the segment; returns true if it was created (empty).
///
/// # Safety
/// Only from the shmem startup hook, with AddinShmemInitLock held and the space requested.
pub unsafe fn attach_or_create() -> bool {
    let l = layout();
    // SAFETY: the caller's contract is shmem::attach's; a new segment comes zeroed (every atomic and
    // summary starts at zero, which is their empty state) and is initialised here before anyone sees it.
    unsafe {
        let (segment, created) = crate::shmem::attach(SEGMENT_NAME, l.bytes());
        let segment = segment.cast::<Header>();
        if created {
            segment.write(Header {
                seed: crate::shmem::random_seed(),
                capacity: l.capacity,
                index_len: l.index_len,
                used: AtomicU32::new(0),
                untracked: AtomicU64::new(0),
                lock: &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE_NAME.as_ptr())).lock,
                purges: Records::default(),
            });
        }
        SEGMENT = segment;
        created
    }
}

/// The attached segment.
pub(super) struct Stats {
    pub(super) header: &'static Header,
}

impl Stats {
    pub(super) fn attach() -> Option<Stats> {
        // SAFETY: SEGMENT is written only in the postmaster's startup hook before any backend exists, then
        // inherited read-only; a non-null pointer points at an initialised header.
        let segment = unsafe { SEGMENT };
        if !crate::shmem::preloaded() || segment.is_null() {
            return None;
        }
        // SAFETY: non-null and initialised (see above), never freed while the server runs.
        let header = unsafe { &*segment };
        Some(Stats { header })
    }

    pub(super) fn index(&self) -> &'static [AtomicU32] {
        let base = (self.header as *const Header).cast::<u8>();
        // SAFETY: the index lies inside the segment at this offset (Layout), index_len words long, and was
        // zeroed at creation; AtomicU32 has the layout of u32.
        unsafe {
            std::slice::from_raw_parts(
                base.add(Layout::index_offset()).cast::<AtomicU32>(),
                self.header.index_len as usize,
            )
        }
    }

    /// A pointer to entry `i` (derived from the segment's own pointer, so it may be written through).
    pub(super) fn entry_ptr(&self, i: u32) -> *mut Entry {
        let l = Layout {
            capacity: self.header.capacity,
            index_len: self.header.index_len,
        };
        debug_assert!(i < l.capacity);
        // SAFETY: SEGMENT is the attached segment (attach succeeded for self); i < capacity (entries are
        // only reached through `used` or the index, both below capacity), so the offset stays inside it.
        unsafe {
            SEGMENT
                .cast::<u8>()
                .add(l.entries_offset())
                .cast::<Entry>()
                .add(i as usize)
        }
    }

    pub(super) fn entry(&self, i: u32) -> &'static Entry {
        // SAFETY: a valid entry (see entry_ptr), zeroed at creation, which is a valid state for every field;
        // its non-atomic fields are written only before it is published.
        unsafe { &*self.entry_ptr(i) }
    }

    pub(super) fn name_hash(&self, database: u32, name: &str) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.header.seed[0], self.header.seed[1]);
        h.write_u32(database);
        h.write(name.as_bytes());
        h.finish()
    }

    pub(super) fn key_hash(&self, key: &str) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.header.seed[1], self.header.seed[0]);
        h.write(key.as_bytes());
        h.finish()
    }

    /// The published entry of (database, name), if any; no lock.
    pub(super) fn find(&self, database: u32, name: &str) -> Option<u32> {
        let index = self.index();
        let mask = index.len() - 1;
        let mut i = self.name_hash(database, name) as usize & mask;
        loop {
            let v = index[i].load(Ordering::Acquire);
            if v == 0 {
                return None;
            }
            let e = self.entry(v - 1);
            if e.database == database && &e.name[..e.name_len as usize] == name.as_bytes() {
                return Some(v - 1);
            }
            i = (i + 1) & mask;
        }
    }

    /// The entry of (database, name), created if there is room; `None` when every entry is taken.
    pub(super) fn find_or_create(&self, database: u32, name: &str) -> Option<u32> {
        if let Some(i) = self.find(database, name) {
            return Some(i);
        }
        if name.len() > NAME_BYTES {
            return None;
        }
        // SAFETY: the lock comes from our tranche of one lock; nothing below allocates, waits or raises an
        // error while it is held.
        unsafe { pg_sys::LWLockAcquire(self.header.lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        let found = self.find(database, name).or_else(|| {
            let used = self.header.used.load(Ordering::Relaxed);
            if used >= self.header.capacity {
                return None;
            }
            let entry = self.entry_ptr(used);
            // SAFETY: entry `used` is unpublished (beyond `used`, absent from the index): no other process
            // reads it until the release stores below, and we hold the creation lock. name fits (checked).
            unsafe {
                (*entry).database = database;
                (*entry).name_len = name.len() as u32;
                ptr::copy_nonoverlapping(
                    name.as_ptr(),
                    (&raw mut (*entry).name).cast::<u8>(),
                    name.len(),
                );
                (*entry).since.store(clock::now_us(), Ordering::Relaxed);
            }
            self.header.used.store(used + 1, Ordering::Release);
            let index = self.index();
            let mask = index.len() - 1;
            let mut i = self.name_hash(database, name) as usize & mask;
            while index[i].load(Ordering::Relaxed) != 0 {
                i = (i + 1) & mask; // the index is at least twice the entries: a free word exists
            }
            index[i].store(used + 1, Ordering::Release);
            Some(used)
        });
        // SAFETY: acquired above.
        unsafe { pg_sys::LWLockRelease(self.header.lock) };
        found
    }
}

impl Entry {
    pub(super) fn name(&self) -> &str {
        std::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or("?")
    }

    pub(super) fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for s in &self.stripes {
            t.calls += s.calls.load(Ordering::Relaxed);
            t.granted += s.granted.load(Ordering::Relaxed);
            t.denied += s.denied.load(Ordering::Relaxed);
            t.tokens += s.tokens.load(Ordering::Relaxed);
            t.shadow_denied += s.shadow_denied.load(Ordering::Relaxed);
            t.blocked += s.blocked.load(Ordering::Relaxed);
        }
        t
    }

    /// Sets the counters to `t` (a reset, or what a clean shutdown saved): the first stripe holds them, the
    /// others are zeroed.
    pub(super) fn set_totals(&self, t: Totals) {
        for (n, s) in self.stripes.iter().enumerate() {
            let v = |x: u64| if n == 0 { x } else { 0 };
            s.calls.store(v(t.calls), Ordering::Relaxed);
            s.granted.store(v(t.granted), Ordering::Relaxed);
            s.denied.store(v(t.denied), Ordering::Relaxed);
            s.tokens.store(v(t.tokens), Ordering::Relaxed);
            s.shadow_denied.store(v(t.shadow_denied), Ordering::Relaxed);
            s.blocked.store(v(t.blocked), Ordering::Relaxed);
        }
    }

    /// Runs `f` on the summary under its spin lock.
    pub(super) fn with_summary<R>(&self, f: impl FnOnce(&mut Summary) -> R) -> R {
        let mut spins = 0u32;
        while self
            .summary_lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: the spin lock gives this process exclusive access to the summary until the release store.
        let r = f(unsafe { &mut *self.summary.get() });
        self.summary_lock.store(0, Ordering::Release);
        r
    }
}

/// Counters added over the stripes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Calls with cost ≥ 1 that named this namespace.
    pub calls: u64,
    /// Of those, granted.
    pub granted: u64,
    /// Of those, refused by this namespace's bucket or block, or that would have been in shadow mode.
    pub denied: u64,
    /// Tokens granted.
    pub tokens: u64,
    /// Of the denied, those the bucket's shadow mode let through (would-be denials).
    pub shadow_denied: u64,
    /// Of the denied, those refused (or, in shadow mode, that would have been) by a block of their key.
    pub blocked: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index has a free word for every probe (at least twice the entries, a power of two for the
    /// mask), and every part starts on a cache line of its own.
    #[test]
    fn layout_leaves_the_index_half_empty_and_aligns_every_part() {
        for capacity in [1u32, 16, 1000, 1_000_000] {
            let l = Layout::for_capacity(capacity);
            assert!(l.index_len.is_power_of_two());
            assert!(l.index_len >= 2 * capacity);
            assert_eq!(Layout::index_offset() % 64, 0);
            assert_eq!(l.entries_offset() % 64, 0);
            assert!(l.entries_offset() >= Layout::index_offset() + 4 * l.index_len as usize);
            assert_eq!(
                l.bytes(),
                l.entries_offset() + capacity as usize * size_of::<Entry>()
            );
        }
        assert_eq!(size_of::<Stripe>(), 64, "one cache line of counters");
    }
}
