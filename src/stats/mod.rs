//! Statistics in shared memory: per policy (and for `rate_limiting_request` and the ad-hoc limits, each as
//! a whole), per database, the calls, grants, denials, tokens granted, the last denial and since when, plus
//! the keys denied most ([`summary`]). Nothing is written to a table on the call path; the counters need
//! the library preloaded (without it nothing is counted and the views raise 55000).
//!
//! Locking contract.
//! - An entry is created once per (database, namespace) under the tranche's single LWLock (exclusive):
//!   its identity is written first, then it is published in the open-addressing index with a release
//!   store. Lookups read the index without any lock (acquire loads); entries are never removed or reused
//!   while the server runs, so an index a backend cached stays valid. When every entry is taken, calls of
//!   new namespaces are counted in `untracked` only.
//! - Counters are atomics updated without a lock, spread over [`STRIPES`] cache lines per entry (chosen by
//!   the backend's pid) so that backends hitting one hot policy do not all write one cache line; readers add
//!   the stripes up. `since` and `last_denial` are single atomic words.
//! - The denied-keys summary of an entry is guarded by a spin lock of its own, held only to update or copy
//!   the summary: a few dozen comparisons, no allocation, nothing that can fail. A backend adds repeated
//!   denials of one key in batches ([`Pending`]): `top_limited` may lag behind `denied` by up to
//!   [`FLUSH_AFTER_DENIALS`] denials per backend, for [`FLUSH_AFTER_US`] while it runs transactions, and
//!   until its next transaction or its exit when it goes idle.
//! - A reset zeroes counters and summaries in place; calls running meanwhile may land on either side.
//!
//! Counting. A call with cost ≥ 1 counts once per (namespace, key) it names: `calls`; `granted` and
//! `tokens` when the whole call was granted; `denied` when this namespace's bucket refused it (in a
//! multi-limit call, another policy may be the one that refused: then only `calls` grows here). Calls with
//! cost 0 (`peek`, reports) are not counted; every attempt of `wait` is.
//!
//! Persistence. A clean shutdown saves every entry with counts to `pg_stat/rate_limit.stats`, loaded by the
//! next start (then deleted); a crash loses them, as pg_stat_statements' do.

pub use rate_limit_model::summary;

use std::cell::{RefCell, UnsafeCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::Hasher;
use std::ptr;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;
use siphasher::sip::SipHasher13;

use crate::algorithm::Outcome;
use crate::clock;
use crate::gucs;
use crate::persist;
use crate::store::target::Target;
use rate_limit_model::summary::{Counter, Summary, KEY_PREFIX};

const SEGMENT_NAME: &CStr = c"rate_limit statistics";
const TRANCHE_NAME: &CStr = c"rate_limit statistics";
const FILE: &str = "pg_stat/rate_limit.stats";
const MAGIC: &[u8; 8] = b"RLSTAT01";

/// Cache lines of counters per entry.
pub const STRIPES: usize = 8;

/// The longest namespace name: a policy name (63 bytes) or `#request` / `#ad_hoc`.
const NAME_BYTES: usize = 64;

/// One cache line of counters.
#[repr(C, align(64))]
#[derive(Default)]
struct Stripe {
    calls: AtomicU64,
    granted: AtomicU64,
    denied: AtomicU64,
    tokens: AtomicU64,
}

/// The statistics of one (database, namespace).
#[repr(C)]
struct Entry {
    /// Written before the entry is published, then read-only.
    database: u32,
    name_len: u32,
    name: [u8; NAME_BYTES],
    /// Wall clock (µs since 2000-01-01) of the entry's creation or last reset.
    since: AtomicI64,
    /// Wall clock of the last denial; 0 if none.
    last_denial: AtomicI64,
    /// Spin lock of `summary`: 0 free, 1 held.
    summary_lock: AtomicU32,
    stripes: [Stripe; STRIPES],
    summary: UnsafeCell<Summary>,
}

/// The segment's header, followed by the index and the entries.
#[repr(C)]
struct Header {
    /// Key of the hashes (namespace lookup, key identity in summaries).
    seed: [u64; 2],
    capacity: u32,
    /// A power of two, at least twice `capacity`.
    index_len: u32,
    /// Entries in use (the first `used` of the array).
    used: AtomicU32,
    /// Calls of namespaces that found no free entry.
    untracked: AtomicU64,
    lock: *mut pg_sys::LWLock,
}

/// Offsets of the segment's parts.
struct Layout {
    capacity: u32,
    index_len: u32,
}

impl Layout {
    fn for_capacity(capacity: u32) -> Layout {
        Layout {
            capacity,
            index_len: (capacity.max(1) * 2).next_power_of_two(),
        }
    }

    fn index_offset() -> usize {
        size_of::<Header>().next_multiple_of(64)
    }

    fn entries_offset(&self) -> usize {
        (Self::index_offset() + self.index_len as usize * size_of::<AtomicU32>())
            .next_multiple_of(64)
    }

    fn bytes(&self) -> usize {
        self.entries_offset() + self.capacity as usize * size_of::<Entry>()
    }
}

/// The segment, once attached; copied into every backend by fork.
static mut SEGMENT: *mut Header = ptr::null_mut();

fn layout() -> Layout {
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
            });
        }
        SEGMENT = segment;
        created
    }
}

/// The attached segment.
struct Stats {
    header: &'static Header,
}

impl Stats {
    fn attach() -> Option<Stats> {
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

    fn index(&self) -> &'static [AtomicU32] {
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
    fn entry_ptr(&self, i: u32) -> *mut Entry {
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

    fn entry(&self, i: u32) -> &'static Entry {
        // SAFETY: a valid entry (see entry_ptr), zeroed at creation, which is a valid state for every field;
        // its non-atomic fields are written only before it is published.
        unsafe { &*self.entry_ptr(i) }
    }

    fn name_hash(&self, database: u32, name: &str) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.header.seed[0], self.header.seed[1]);
        h.write_u32(database);
        h.write(name.as_bytes());
        h.finish()
    }

    fn key_hash(&self, key: &str) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.header.seed[1], self.header.seed[0]);
        h.write(key.as_bytes());
        h.finish()
    }

    /// The published entry of (database, name), if any; no lock.
    fn find(&self, database: u32, name: &str) -> Option<u32> {
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
    fn find_or_create(&self, database: u32, name: &str) -> Option<u32> {
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
    fn name(&self) -> &str {
        std::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or("?")
    }

    fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for s in &self.stripes {
            t.calls += s.calls.load(Ordering::Relaxed);
            t.granted += s.granted.load(Ordering::Relaxed);
            t.denied += s.denied.load(Ordering::Relaxed);
            t.tokens += s.tokens.load(Ordering::Relaxed);
        }
        t
    }

    /// Runs `f` on the summary under its spin lock.
    fn with_summary<R>(&self, f: impl FnOnce(&mut Summary) -> R) -> R {
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
    /// Of those, refused by this namespace's bucket.
    pub denied: u64,
    /// Tokens granted.
    pub tokens: u64,
}

fn current_database() -> u32 {
    // SAFETY: MyDatabaseId is a plain global of the backend, set at connection and read on its only thread.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

thread_local! {
    /// This backend's entry of each namespace (a backend stays in one database; entries are never reused).
    static ENTRIES: RefCell<HashMap<Box<str>, u32>> = RefCell::new(HashMap::new());
}

fn entry_for(stats: &Stats, name: &str) -> Option<u32> {
    if let Some(i) = ENTRIES.with(|m| m.borrow().get(name).copied()) {
        return Some(i);
    }
    let i = stats.find_or_create(current_database(), name)?;
    ENTRIES.with(|m| m.borrow_mut().insert(name.into(), i));
    Some(i)
}

/// Counts a call of `cost` tokens over `targets` with their `outcomes`. Does nothing when the library is
/// not preloaded, for cost 0, or with `rate_limit.track_stats` off.
pub fn record(targets: &[Target<'_>], outcomes: &[Outcome], cost: i64) {
    if cost <= 0 || !gucs::track_stats() {
        return;
    }
    let Some(stats) = Stats::attach() else {
        return;
    };
    let allowed = outcomes.iter().all(|o| o.allowed);
    // SAFETY: MyProcPid is a plain global of the backend.
    let stripe = unsafe { pg_sys::MyProcPid } as usize % STRIPES;
    for (t, o) in targets.iter().zip(outcomes) {
        let Some(i) = entry_for(&stats, t.namespace.stored_name()) else {
            stats.header.untracked.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let e = stats.entry(i);
        let s = &e.stripes[stripe];
        s.calls.fetch_add(1, Ordering::Relaxed);
        if allowed {
            s.granted.fetch_add(1, Ordering::Relaxed);
            s.tokens.fetch_add(cost as u64, Ordering::Relaxed);
        } else if !o.allowed {
            s.denied.fetch_add(1, Ordering::Relaxed);
            let now = clock::now_us();
            // to the millisecond: a denied flood does not make every backend write this word every call
            if e.last_denial.load(Ordering::Relaxed) < now - 1000 {
                e.last_denial.store(now, Ordering::Relaxed);
            }
            note_denial(&stats, i, t.key, now);
        }
    }
}

/// Denials of one key that this backend counted but has not yet added to its policy's summary. A client
/// hammering a key is denied many times in a row; adding each denial to the shared summary would make every
/// backend write the same cache lines under the summary's lock. They are added after
/// [`FLUSH_AFTER_DENIALS`] denials, when another key is denied, at the end of a transaction
/// [`FLUSH_AFTER_US`] after the first of them, when this backend reads or resets the statistics, and when
/// it exits.
struct Pending {
    entry: u32,
    hash: u64,
    key: String,
    count: u64,
    since: i64,
}

/// Denials of one key a backend adds to the summary at once, at most.
pub const FLUSH_AFTER_DENIALS: u64 = 64;
/// How long (µs) a backend keeps denials from the summary, at most, while it runs transactions.
pub const FLUSH_AFTER_US: i64 = 100_000;

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
    static EXIT_HOOK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn note_denial(stats: &Stats, entry: u32, key: &str, now: i64) {
    let hash = stats.key_hash(key);
    let due = PENDING.with(|cell| {
        let mut slot = cell.borrow_mut();
        match slot.as_mut() {
            Some(p) if p.entry == entry && p.hash == hash => {
                p.count += 1;
                if p.count >= FLUSH_AFTER_DENIALS || now - p.since >= FLUSH_AFTER_US {
                    slot.take()
                } else {
                    None
                }
            }
            _ => slot.replace(Pending {
                entry,
                hash,
                key: key.to_string(),
                count: 1,
                since: now,
            }),
        }
    });
    if !EXIT_HOOK.with(|h| h.replace(true)) {
        // SAFETY: registering an exit callback is allowed at any time in a backend; the function lives as
        // long as the library, which is never unloaded.
        unsafe { pg_sys::before_shmem_exit(Some(flush_at_exit), pg_sys::Datum::from(0)) };
    }
    if let Some(p) = due {
        add_to_summary(stats, p);
    }
}

fn add_to_summary(stats: &Stats, p: Pending) {
    stats
        .entry(p.entry)
        .with_summary(|summary| summary.record(p.hash, p.key.as_bytes(), p.count));
}

/// Adds this backend's pending denials to the summary now.
fn flush_pending(stats: &Stats) {
    if let Some(p) = PENDING.with(|cell| cell.borrow_mut().take()) {
        add_to_summary(stats, p);
    }
}

/// At the end of a transaction: adds the pending denials if the first of them is [`FLUSH_AFTER_US`] old.
/// Reads the clock only when denials are pending.
pub fn flush_if_due() {
    let pending_since = PENDING.with(|cell| cell.borrow().as_ref().map(|p| p.since));
    if let (Some(since), Some(stats)) = (pending_since, Stats::attach()) {
        if clock::now_us() - since >= FLUSH_AFTER_US {
            flush_pending(&stats);
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn flush_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if let Some(stats) = Stats::attach() {
        flush_pending(&stats);
    }
}

/// 55000 with a hint: the statistics live in shared memory.
fn not_preloaded(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "rate_limit statistics are not available: the library was not preloaded",
        function,
    )
    .set_hint(
        "Add rate_limit to shared_preload_libraries in postgresql.conf and restart the server: the \
         statistics are kept in shared memory.",
    )
}

/// One namespace's statistics in the current database.
pub struct Row {
    /// The namespace name (a policy, `#request` or `#ad_hoc`).
    pub name: String,
    /// The counters.
    pub totals: Totals,
    /// Wall clock of the last denial (µs), if any.
    pub last_denial: Option<i64>,
    /// Wall clock of creation or reset (µs).
    pub since: i64,
    /// The most denied keys, most first.
    pub top: Vec<Counter>,
}

/// Every namespace of the current database with statistics; 55000 without preloading.
pub fn rows(function: &'static str) -> Result<Vec<Row>, ErrorReport> {
    let stats = Stats::attach().ok_or_else(|| not_preloaded(function))?;
    flush_pending(&stats);
    let database = current_database();
    let used = stats.header.used.load(Ordering::Acquire);
    let mut rows = Vec::new();
    for i in 0..used {
        let e = stats.entry(i);
        if e.database != database {
            continue;
        }
        let mut summary = Summary::default();
        e.with_summary(|s| summary = *s);
        let last = e.last_denial.load(Ordering::Relaxed);
        rows.push(Row {
            name: e.name().to_string(),
            totals: e.totals(),
            last_denial: (last != 0).then_some(last),
            since: e.since.load(Ordering::Relaxed),
            top: summary.ranked(),
        });
    }
    Ok(rows)
}

/// Calls of namespaces that found no free entry (all databases); 55000 without preloading.
pub fn untracked(function: &'static str) -> Result<u64, ErrorReport> {
    let stats = Stats::attach().ok_or_else(|| not_preloaded(function))?;
    Ok(stats.header.untracked.load(Ordering::Relaxed))
}

/// Zeroes the statistics of the current database's namespace `name`, or of all of them; returns how many
/// entries were reset.
pub fn reset(function: &'static str, name: Option<&str>) -> Result<i64, ErrorReport> {
    let stats = Stats::attach().ok_or_else(|| not_preloaded(function))?;
    flush_pending(&stats);
    let database = current_database();
    let used = stats.header.used.load(Ordering::Acquire);
    let now = clock::now_us();
    let mut n = 0;
    for i in 0..used {
        let e = stats.entry(i);
        if e.database != database || name.is_some_and(|n| n != e.name()) {
            continue;
        }
        for s in &e.stripes {
            s.calls.store(0, Ordering::Relaxed);
            s.granted.store(0, Ordering::Relaxed);
            s.denied.store(0, Ordering::Relaxed);
            s.tokens.store(0, Ordering::Relaxed);
        }
        e.last_denial.store(0, Ordering::Relaxed);
        e.with_summary(|s| *s = Summary::default());
        e.since.store(now, Ordering::Relaxed);
        n += 1;
    }
    if name.is_none() && stats.header.untracked.load(Ordering::Relaxed) != 0 {
        stats.header.untracked.store(0, Ordering::Relaxed);
    }
    Ok(n)
}

/// Saves every entry with counts (clean shutdown, in the postmaster).
pub fn save() {
    let Some(stats) = Stats::attach() else {
        return;
    };
    let used = stats.header.used.load(Ordering::Acquire);
    let mut w = persist::Writer::new(MAGIC);
    w.u64(stats.header.seed[0]);
    w.u64(stats.header.seed[1]);
    let kept: Vec<u32> = (0..used)
        .filter(|&i| stats.entry(i).totals().calls != 0)
        .collect();
    w.u32(kept.len() as u32);
    for i in kept {
        let e = stats.entry(i);
        let t = e.totals();
        w.u32(e.database);
        w.u32(e.name_len);
        w.bytes(&e.name[..e.name_len as usize]);
        w.i64(e.since.load(Ordering::Relaxed));
        w.i64(e.last_denial.load(Ordering::Relaxed));
        for v in [t.calls, t.granted, t.denied, t.tokens] {
            w.u64(v);
        }
        let summary = e.with_summary(|s| *s);
        for c in &summary.counters {
            w.u64(c.hash);
            w.u64(c.count);
            w.u64(c.error);
            w.u32(u32::from(c.key_len));
            w.bytes(&c.key_prefix);
        }
    }
    persist::write_file(FILE, "statistics", &w.finish());
}

/// Loads what a clean shutdown saved into the segment just created (in the postmaster, at start).
pub fn load_saved() {
    persist::read_file(FILE, "statistics entries", |bytes| {
        let stats = Stats::attach().ok_or("the statistics segment is missing")?;
        let mut r = persist::open(bytes, MAGIC)?;
        let bad = "the payload is malformed";
        let seed = [r.u64().ok_or(bad)?, r.u64().ok_or(bad)?];
        let count = r.u32().ok_or(bad)?;
        // Parse everything before touching shared memory: a damaged file changes nothing.
        let mut loaded = Vec::new();
        for _ in 0..count {
            let database = r.u32().ok_or(bad)?;
            let name_len = r.u32().ok_or(bad)? as usize;
            if name_len > NAME_BYTES {
                return Err(bad);
            }
            let name = std::str::from_utf8(r.bytes(name_len).ok_or(bad)?).map_err(|_| bad)?;
            let since = r.i64().ok_or(bad)?;
            let last = r.i64().ok_or(bad)?;
            let t = Totals {
                calls: r.u64().ok_or(bad)?,
                granted: r.u64().ok_or(bad)?,
                denied: r.u64().ok_or(bad)?,
                tokens: r.u64().ok_or(bad)?,
            };
            let mut summary = Summary::default();
            for c in summary.counters.iter_mut() {
                c.hash = r.u64().ok_or(bad)?;
                c.count = r.u64().ok_or(bad)?;
                c.error = r.u64().ok_or(bad)?;
                c.key_len = u16::try_from(r.u32().ok_or(bad)?).map_err(|_| bad)?;
                c.key_prefix = r
                    .bytes(KEY_PREFIX)
                    .ok_or(bad)?
                    .try_into()
                    .map_err(|_| bad)?;
            }
            loaded.push((database, name.to_string(), since, last, t, summary));
        }
        if !r.at_end() {
            return Err(bad);
        }
        // The summaries identify keys by their hashes under the saved key: keep using it.
        // SAFETY: SEGMENT points at the header just created (Stats::attach succeeded); we are in the
        // postmaster at start, before any backend exists and before any entry is hashed.
        unsafe { (*SEGMENT).seed = seed };
        let mut n = 0;
        for (database, name, since, last, t, summary) in loaded {
            let Some(i) = stats.find_or_create(database, &name) else {
                break; // fewer entries than before (rate_limit.stats_max was lowered)
            };
            let e = stats.entry(i);
            let s = &e.stripes[0];
            s.calls.store(t.calls, Ordering::Relaxed);
            s.granted.store(t.granted, Ordering::Relaxed);
            s.denied.store(t.denied, Ordering::Relaxed);
            s.tokens.store(t.tokens, Ordering::Relaxed);
            e.since.store(since, Ordering::Relaxed);
            e.last_denial.store(last, Ordering::Relaxed);
            e.with_summary(|s| *s = summary);
            n += 1;
        }
        Ok(n)
    });
}
