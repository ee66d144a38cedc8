//! The memory store: buckets in a hash table in PostgreSQL's shared memory. No WAL, no table, nothing
//! transactional: it works in read-only transactions and on hot standbys. Its state is saved at a clean
//! shutdown and loaded at the next start (module `snapshot`); a crash loses it (or goes back to the last
//! snapshot, with `rate_limit.memory_snapshot_interval`).
//!
//! Locking contract.
//! - The table is split into `partitions` partitions, each a fixed ring of slots with its own LWLock (tranche
//!   `rate_limit`). A key's 128-bit hash picks its partition, so one call takes exactly one lock.
//! - A bucket's level and instant are one 128-bit atomic word ([`AtomicState`]). Taking tokens from one
//!   existing bucket whose numbers are those of the call (the common case) holds the partition's lock
//!   SHARED and updates that word with a compare-and-swap loop ([`swap_take`]): callers of a partition
//!   never wait for each other, so a backend preempted in the middle of a call stalls nobody, and two calls
//!   on one bucket serialise on the word (a failed swap re-reads and re-evaluates: exact). Inserting,
//!   evicting, deleting, refunds, a call on several buckets (all or nothing) and a bucket whose numbers
//!   changed (a policy was altered) hold the lock EXCLUSIVE, which excludes every swap. `peek` and listing
//!   hold it SHARED and read the word atomically. Where the CPU has no lock-free 128-bit compare-and-swap
//!   (x86-64 CPUs without CMPXCHG16B), every take holds the lock EXCLUSIVE.
//! - The two guard types enforce the rest: a [`SharedGuard`] only hands out `&[Slot]` (whose state word is
//!   the one field that changes behind it), an [`ExclusiveGuard`] `&mut [Slot]`. While a lock is held nothing
//!   allocates, waits, does I/O, takes another lock or raises an error: errors are raised after the lock is
//!   released. A call locks at most [`MAX_TARGETS`] partitions, lowest first (more targets are an error,
//!   never a truncation).
//! - The header (seed, sizes, lock pointers) is written once, in the shmem startup hook under
//!   AddinShmemInitLock, and only read afterwards. Statistics are atomics, updated without a lock.
//!
//! Keys. A slot stores the 128-bit SipHash-1-3 of the id, keyed with a random seed drawn when the table is
//! created, so ids chosen by an attacker cannot be made to collide or pile up in one partition. Two distinct
//! ids share a bucket only if their keyed hashes collide: with n buckets the chance is below n² / 2^129
//! (for a million buckets, about 1.5e-27). The current database's OID is hashed with the id, so buckets
//! are per database, as in the table store. The first [`ID_PREFIX`] bytes of the id are kept for display
//! in `rate_limit.buckets`; the id itself may be up to 2048 bytes, like in the table store.
//!
//! Slots use linear probing inside their partition and backward-shift deletion (no tombstones), so a probe
//! stops at the first empty slot. Each partition holds at most `ceil(max_buckets / partitions)` buckets in
//! 25% more slots. When a partition is full, a bucket that is full now is evicted first (lossless: a
//! missing bucket is a full one); failing that, `rate_limit.on_full` decides. An insert examines at most
//! [`EVICTION_SCAN`] slots under its exclusive lock, from a hand that moves on through the partition, so a
//! flood of new keys into a full partition costs a bounded time per call; with `on_full = 'error'` a call may
//! be refused while a full bucket lies outside the slots it examined (the next insert looks further).
//!
//! Time. The store measures time on [`clock::monotonic_us`], a clock that never steps, anchored to the wall
//! clock when the segment is created (`clock_base`): while the server runs, wall-clock steps (NTP, VM
//! restore) neither mint tokens nor freeze buckets here; across a restart, `snapshot` converts instants
//! through the wall clock. Listings show instants converted to the wall clock of the moment of the listing.

use std::ffi::CStr;
use std::hash::Hasher;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use portable_atomic::AtomicU128;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::algorithm::{Algorithm, Outcome, Policy, State};
use crate::clock;
use crate::gucs::{self, OnFull};
use crate::store::target::{Namespace, Stored, Target, MAX_TARGETS};

mod snapshot;
pub use snapshot::{load as load_saved, save};

/// Slots an insert into a full partition examines at most to find a bucket to evict.
pub const EVICTION_SCAN: usize = 128;

/// Bytes of an id kept in a slot for display.
pub const ID_PREFIX: usize = 28;

/// `Slot::used` values: what kind of bucket a slot holds (0 is an empty slot).
const KIND_REQUEST: u8 = 1;
const KIND_AD_HOC: u8 = 2;
const KIND_POLICY: u8 = 3;

const SEGMENT_NAME: &CStr = c"rate_limit memory store";
const TRANCHE_NAME: &CStr = c"rate_limit";

/// A bucket's state (level and instant) as one 128-bit word, so that it can be swapped atomically.
#[repr(transparent)]
pub struct AtomicState(AtomicU128);

impl AtomicState {
    /// A word holding `state`.
    pub fn new(state: State) -> AtomicState {
        AtomicState(AtomicU128::new(Self::pack(state)))
    }

    fn pack(state: State) -> u128 {
        (u128::from(state.at as u64) << 64) | u128::from(state.level as u64)
    }

    fn unpack(word: u128) -> State {
        State {
            level: word as u64 as i64,
            at: (word >> 64) as u64 as i64,
        }
    }

    /// The state now.
    pub fn load(&self) -> State {
        Self::unpack(self.0.load(Ordering::Acquire))
    }

    /// Writes `state` (under the exclusive lock, or when nobody else can see the slot).
    pub fn store(&self, state: State) {
        self.0.store(Self::pack(state), Ordering::Release);
    }

    /// Replaces `current` with `new` if the word still holds `current`; false if it changed meanwhile.
    pub fn swap_if(&self, current: State, new: State) -> bool {
        self.0
            .compare_exchange(
                Self::pack(current),
                Self::pack(new),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Whether swaps are lock-free on this CPU. Only then may two processes swap the same word concurrently:
    /// the fallback of `portable_atomic` locks process-local memory, which processes do not share.
    pub fn swaps_are_lock_free() -> bool {
        AtomicU128::is_lock_free()
    }
}

/// One bucket. `used` is 0 for an empty slot, else the kind of bucket (`KIND_*`). The numbers (`algorithm`,
/// `rate`, `period_us`, `burst`) are those the level was last written under (see `crate::algorithm`); only
/// `state` changes while the partition is locked SHARED.
#[repr(C)]
struct Slot {
    hash: [u64; 2],
    state: AtomicState,
    rate: i64,
    period_us: i64,
    burst: i64,
    database: u32,
    policy_tag: u32,
    used: u8,
    algorithm: u8,
    id_len: u8,
    id_truncated: u8,
    id_prefix: [u8; ID_PREFIX],
}

impl Clone for Slot {
    fn clone(&self) -> Slot {
        Slot {
            hash: self.hash,
            state: AtomicState::new(self.state.load()),
            rate: self.rate,
            period_us: self.period_us,
            burst: self.burst,
            database: self.database,
            policy_tag: self.policy_tag,
            used: self.used,
            algorithm: self.algorithm,
            id_len: self.id_len,
            id_truncated: self.id_truncated,
            id_prefix: self.id_prefix,
        }
    }
}

/// Per-partition bookkeeping, protected by the partition's lock.
#[repr(C)]
struct PartitionHeader {
    count: u32,
    /// Where the next eviction scan starts.
    hand: u32,
}

/// The start of the segment; fixed after creation except for the atomics.
#[repr(C)]
struct Header {
    seed: [u64; 2],
    /// Wall-clock microseconds minus monotonic microseconds when the segment was created.
    clock_base: i64,
    partitions: u32,
    slots_per_partition: u32,
    limit_per_partition: u32,
    max_buckets: u32,
    locks: *mut pg_sys::LWLockPadded,
    lossless_evictions: AtomicU64,
    lossy_evictions: AtomicU64,
    refused_full: AtomicU64,
}

/// Sizes derived from `rate_limit.max_buckets`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Partitions (one LWLock each).
    pub partitions: u32,
    /// Buckets a partition may hold.
    pub limit_per_partition: u32,
    /// Slots in a partition (25% more than its limit, so probes stay short).
    pub slots_per_partition: u32,
}

impl Geometry {
    /// About 64 buckets per partition for small tables, at most 128 partitions (as core's buffer table).
    pub fn for_max_buckets(max_buckets: u32) -> Geometry {
        let partitions = (max_buckets / 64).clamp(1, 128);
        let limit_per_partition = max_buckets.div_ceil(partitions);
        let slots_per_partition = limit_per_partition + limit_per_partition.div_ceil(4) + 1;
        Geometry {
            partitions,
            limit_per_partition,
            slots_per_partition,
        }
    }

    fn partition_headers_offset() -> usize {
        size_of::<Header>().next_multiple_of(64)
    }

    fn slots_offset(&self) -> usize {
        (Self::partition_headers_offset() + self.partitions as usize * size_of::<PartitionHeader>())
            .next_multiple_of(64)
    }

    /// Bytes of shared memory the table needs.
    pub fn segment_bytes(&self) -> usize {
        self.slots_offset()
            + self.partitions as usize * self.slots_per_partition as usize * size_of::<Slot>()
    }
}

/// Bytes of one slot.
pub const SLOT_BYTES: usize = size_of::<Slot>();

/// The segment, once attached; copied into every backend by fork.
static mut SEGMENT: *mut Header = ptr::null_mut();

fn geometry() -> Geometry {
    Geometry::for_max_buckets(gucs::max_buckets().max(1) as u32)
}

/// Requests the segment and the partition locks ([`crate::shmem`] calls it in the request phase).
///
/// # Safety
/// Only in the postmaster while shared memory may still be requested.
pub unsafe fn request_shmem() {
    let g = geometry();
    // SAFETY: the caller guarantees we are in the request phase; the name is a static C string.
    unsafe {
        pg_sys::RequestAddinShmemSpace(g.segment_bytes());
        pg_sys::RequestNamedLWLockTranche(TRANCHE_NAME.as_ptr(), g.partitions as i32);
    }
}

/// Creates or finds the segment ([`crate::shmem`] calls it from the startup hook, holding
/// AddinShmemInitLock); returns true if it was created (empty).
///
/// # Safety
/// Only from the shmem startup hook, with AddinShmemInitLock held and the space requested.
pub unsafe fn attach_or_create() -> bool {
    // SAFETY: the caller holds AddinShmemInitLock, as pg_stat_statements does; the segment is initialised
    // only by whoever created it. All pointers stay inside the segment sized by request_shmem.
    unsafe {
        let g = geometry();
        let mut found = false;
        let segment = pg_sys::ShmemInitStruct(SEGMENT_NAME.as_ptr(), g.segment_bytes(), &mut found)
            .cast::<Header>();
        if !found {
            ptr::write_bytes(segment.cast::<u8>(), 0, g.segment_bytes());
            segment.write(Header {
                seed: crate::shmem::random_seed(),
                clock_base: clock::now_us() - clock::monotonic_us(),
                partitions: g.partitions,
                slots_per_partition: g.slots_per_partition,
                limit_per_partition: g.limit_per_partition,
                max_buckets: gucs::max_buckets().max(1) as u32,
                locks: pg_sys::GetNamedLWLockTranche(TRANCHE_NAME.as_ptr()),
                lossless_evictions: AtomicU64::new(0),
                lossy_evictions: AtomicU64::new(0),
                refused_full: AtomicU64::new(0),
            });
        }
        SEGMENT = segment;
        !found
    }
}

/// Whether the memory store exists (the library was preloaded).
pub fn available() -> bool {
    Table::attach("rate_limit").is_ok()
}

/// Now on the memory store's clock; 55000 when it is not available.
pub fn now(function: &'static str) -> Result<i64, ErrorReport> {
    Ok(Table::attach(function)?.now())
}

/// 55000 with a hint, for every memory-store call in a server that did not preload the library.
fn not_preloaded(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "the rate_limit memory store is not available: the library was not preloaded",
        function,
    )
    .set_hint(
        "Add rate_limit to shared_preload_libraries in postgresql.conf and restart the server, \
         or SET rate_limit.store = 'table'.",
    )
}

/// The attached segment.
struct Table {
    header: &'static Header,
}

impl Table {
    fn attach(function: &'static str) -> Result<Table, ErrorReport> {
        // SAFETY: SEGMENT is written only by shmem_startup in the postmaster before any backend exists,
        // then inherited read-only; a non-null pointer points at an initialised Header.
        let segment = unsafe { SEGMENT };
        if !crate::shmem::preloaded() || segment.is_null() {
            return Err(not_preloaded(function));
        }
        // SAFETY: non-null and initialised (see above); the header is never freed while the server runs.
        let header = unsafe { &*segment };
        Ok(Table { header })
    }

    /// Now on the store's clock (monotonic, anchored to the wall clock at creation).
    fn now(&self) -> i64 {
        clock::monotonic_us() + self.header.clock_base
    }

    /// What to add to an instant of the store's clock to show it on the wall clock now.
    fn wall_offset(&self) -> i64 {
        clock::now_us() - self.now()
    }

    /// The keyed hash of a bucket: (database, kind, policy creation time, namespace, 0xFF, key). Buckets
    /// are per database, as in the table store; the kind byte separates the namespaces; 0xFF never occurs
    /// in UTF-8, so the namespace and the key cannot be confused.
    fn bucket_hash(&self, namespace: &Namespace<'_>, key: &str) -> [u64; 2] {
        let mut hasher = SipHasher13::new_with_keys(self.header.seed[0], self.header.seed[1]);
        hasher.write_u32(current_database());
        hasher.write_u8(kind_of(namespace));
        hasher.write_i64(namespace.created_at());
        hasher.write(namespace.stored_name().as_bytes());
        hasher.write_u8(0xFF);
        hasher.write(key.as_bytes());
        let h = hasher.finish128();
        [h.h1, h.h2]
    }

    /// The lock, header and slots of partition `p`.
    ///
    /// # Safety
    /// `p < partitions`; the caller must hold the partition's lock before dereferencing the pointers.
    unsafe fn partition(&self, p: u32) -> (*mut pg_sys::LWLock, *mut PartitionHeader, *mut Slot) {
        let h = self.header;
        let g = Geometry {
            partitions: h.partitions,
            limit_per_partition: h.limit_per_partition,
            slots_per_partition: h.slots_per_partition,
        };
        let base = (h as *const Header).cast::<u8>();
        // SAFETY: p < partitions (the caller's contract), so every offset below lies inside the segment laid
        // out by Geometry; the lock pointer comes from the tranche of `partitions` locks.
        unsafe {
            let lock = &raw mut (*h.locks.add(p as usize)).lock;
            let header = base
                .add(Geometry::partition_headers_offset())
                .cast::<PartitionHeader>()
                .add(p as usize)
                .cast_mut();
            let slots = base
                .add(g.slots_offset())
                .cast::<Slot>()
                .add(p as usize * g.slots_per_partition as usize)
                .cast_mut();
            (lock, header, slots)
        }
    }

    /// Locks partition `p` (taken modulo the partition count) SHARED: read access until the guard drops.
    fn lock_shared(&self, p: u32) -> SharedGuard<'_> {
        let p = p % self.header.partitions;
        // SAFETY: p < partitions; the shared lock is taken before the header and slots are borrowed, and
        // only shared borrows are made: writers need the exclusive lock, which cannot be held meanwhile.
        unsafe {
            let (lock, header, slots) = self.partition(p);
            pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_SHARED);
            SharedGuard {
                lock,
                header: &*header,
                slots: std::slice::from_raw_parts(slots, self.header.slots_per_partition as usize),
            }
        }
    }

    /// Locks partition `p` (taken modulo the partition count) EXCLUSIVE: write access until the guard drops.
    fn lock_exclusive(&self, p: u32) -> ExclusiveGuard<'_> {
        let p = p % self.header.partitions;
        // SAFETY: p < partitions; the exclusive lock is taken before the header and slots are borrowed
        // mutably, so no other process reads or writes them while the guard lives.
        unsafe {
            let (lock, header, slots) = self.partition(p);
            pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            ExclusiveGuard {
                lock,
                partition: Partition {
                    header: &mut *header,
                    slots: std::slice::from_raw_parts_mut(
                        slots,
                        self.header.slots_per_partition as usize,
                    ),
                    limit: self.header.limit_per_partition,
                },
            }
        }
    }

    fn partition_of(&self, hash: &[u64; 2]) -> u32 {
        (hash[0] % u64::from(self.header.partitions)) as u32
    }

    /// Starts loading the slot where `hash`'s probe chain starts into the CPU cache, before its partition
    /// is locked. With a large table that slot is nearly always a cache (and TLB) miss; issued for every
    /// bucket of a call first, the misses overlap each other and the lock acquisition instead of being
    /// served one by one under the lock.
    fn prefetch(&self, hash: &[u64; 2]) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let slots_per_partition = u64::from(self.header.slots_per_partition);
            // SAFETY: partition_of is below the partition count; the pointer is only computed, not
            // dereferenced, so no lock is needed.
            let (_, _, slots) = unsafe { self.partition(self.partition_of(hash)) };
            let slot = slots
                .wrapping_add((hash[1] % slots_per_partition) as usize)
                .cast::<i8>()
                .cast_const();
            // SAFETY: a prefetch is a hint that never faults and changes no memory; the address lies inside
            // the segment (a slot spans at most two cache lines: both are fetched).
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(slot);
                _mm_prefetch::<_MM_HINT_T0>(slot.wrapping_add(64));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = hash;
    }
}

/// A partition locked SHARED: it can only be read.
struct SharedGuard<'a> {
    lock: *mut pg_sys::LWLock,
    header: &'a PartitionHeader,
    slots: &'a [Slot],
}

/// A partition locked EXCLUSIVE: it can be read and written.
struct ExclusiveGuard<'a> {
    lock: *mut pg_sys::LWLock,
    partition: Partition<'a>,
}

/// A partition's slot table, writable: what an [`ExclusiveGuard`] gives access to (and what the model tests
/// drive directly, without PostgreSQL).
struct Partition<'a> {
    header: &'a mut PartitionHeader,
    slots: &'a mut [Slot],
    /// Buckets the partition may hold.
    limit: u32,
}

impl<'a> std::ops::Deref for ExclusiveGuard<'a> {
    type Target = Partition<'a>;
    fn deref(&self) -> &Partition<'a> {
        &self.partition
    }
}

impl<'a> std::ops::DerefMut for ExclusiveGuard<'a> {
    fn deref_mut(&mut self) -> &mut Partition<'a> {
        &mut self.partition
    }
}

impl Drop for SharedGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the lock was acquired in Table::lock_shared by this guard and is released exactly once.
        unsafe { pg_sys::LWLockRelease(self.lock) }
    }
}

impl Drop for ExclusiveGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the lock was acquired in Table::lock_exclusive by this guard and is released exactly once.
        unsafe { pg_sys::LWLockRelease(self.lock) }
    }
}

enum Probe {
    Found(usize),
    Empty(usize),
}

/// The slot where `hash`'s probe chain starts.
fn home(slots: &[Slot], hash: &[u64; 2]) -> usize {
    (hash[1] % slots.len() as u64) as usize
}

/// Finds `hash` in a partition's slots, or the empty slot that ends its probe chain.
fn probe(slots: &[Slot], hash: &[u64; 2]) -> Probe {
    let n = slots.len();
    let start = home(slots, hash);
    for i in 0..n {
        let idx = (start + i) % n;
        let slot = &slots[idx];
        if slot.used == 0 {
            return Probe::Empty(idx);
        }
        if slot.hash == *hash {
            return Probe::Found(idx);
        }
    }
    // unreachable while count <= limit < slots; an empty slot is always found
    Probe::Empty(start)
}

impl SharedGuard<'_> {
    fn probe(&self, hash: &[u64; 2]) -> Probe {
        probe(self.slots, hash)
    }
}

impl Partition<'_> {
    fn probe(&self, hash: &[u64; 2]) -> Probe {
        probe(self.slots, hash)
    }

    /// Puts `slot` into the empty slot `idx` that ends its probe chain.
    fn insert(&mut self, idx: usize, slot: Slot) {
        self.slots[idx] = slot;
        self.header.count += 1;
    }

    /// Removes slot `hole`, shifting later entries of its probe chain back (no tombstones).
    fn remove(&mut self, mut hole: usize) {
        let n = self.slots.len();
        self.slots[hole].used = 0;
        self.header.count = self.header.count.saturating_sub(1);
        let mut j = hole;
        loop {
            j = (j + 1) % n;
            if self.slots[j].used == 0 {
                return;
            }
            let home = home(self.slots, &self.slots[j].hash);
            // the entry at j may move to the hole unless its home lies cyclically in (hole, j]
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j].clone();
                self.slots[j].used = 0;
                hole = j;
            }
        }
    }

    /// Frees one slot of a full partition: a bucket that is full now if any among the [`EVICTION_SCAN`]
    /// slots examined from the hand, else per `on_full` the least recently updated of them. Returns false
    /// if nothing may be evicted.
    fn make_room(
        &mut self,
        now: i64,
        on_full: OnFull,
        stats: &Header,
        protect: &[[u64; 2]],
    ) -> bool {
        let n = self.slots.len();
        let start = self.header.hand as usize % n;
        let scan = EVICTION_SCAN.min(n);
        let mut oldest: Option<usize> = None;
        for step in 0..scan {
            let i = (start + step) % n;
            let s = &self.slots[i];
            if s.used == 0 || protect.contains(&s.hash) {
                continue;
            }
            if slot_is_full(s, now) {
                self.header.hand = ((i + 1) % n) as u32;
                self.remove(i);
                stats.lossless_evictions.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            if oldest.is_none_or(|o| s.state.load().at < self.slots[o].state.load().at) {
                oldest = Some(i);
            }
        }
        self.header.hand = ((start + scan) % n) as u32;
        if on_full == OnFull::EvictOldest {
            if let Some(i) = oldest {
                self.remove(i);
                stats.lossy_evictions.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }
}

fn current_database() -> u32 {
    // SAFETY: MyDatabaseId is a plain global of the backend, set at connection and read on its only thread.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// The numbers a slot's level was written under.
fn slot_policy(slot: &Slot) -> Option<Policy> {
    let algorithm = Algorithm::from_code(slot.algorithm)?;
    Policy::new(algorithm, slot.rate, slot.period_us, slot.burst).ok()
}

fn slot_state(slot: &Slot) -> State {
    slot.state.load()
}

/// Whether the slot's bucket is full at `now` (and may be deleted losslessly).
fn slot_is_full(slot: &Slot, now: i64) -> bool {
    slot_policy(slot).is_some_and(|p| p.is_full(slot_state(slot), now))
}

fn kind_of(namespace: &Namespace<'_>) -> u8 {
    match namespace {
        Namespace::Policy { .. } => KIND_POLICY,
        Namespace::AdHoc => KIND_AD_HOC,
        Namespace::Request => KIND_REQUEST,
    }
}

/// A 32-bit tag of a policy incarnation, kept in its slots to name the policy when listing.
pub fn policy_tag(name: &str, created_at: i64) -> u32 {
    if name.is_empty() {
        return 0;
    }
    let mut hasher = SipHasher13::new_with_keys(0, 0);
    hasher.write_i64(created_at);
    hasher.write(name.as_bytes());
    (hasher.finish128().h1 & 0xFFFF_FFFF) as u32
}

/// The numbers a slot records with its level.
#[derive(Clone, Copy)]
struct Numbers {
    algorithm: Algorithm,
    rate: i64,
    period_us: i64,
    burst: i64,
}

impl Numbers {
    fn of_policy(p: &Policy) -> Numbers {
        Numbers {
            algorithm: p.algorithm(),
            rate: p.rate(),
            period_us: p.period_us(),
            burst: p.burst(),
        }
    }

    fn write_to(&self, slot: &mut Slot) {
        slot.algorithm = self.algorithm.code();
        slot.rate = self.rate;
        slot.period_us = self.period_us;
        slot.burst = self.burst;
    }
}

/// A new slot for `hash` holding `state` under `numbers`.
fn new_slot(hash: [u64; 2], kind: u8, tag: u32, id: &str, numbers: Numbers, state: State) -> Slot {
    let (prefix, prefix_len) = id_prefix(id);
    Slot {
        hash,
        state: AtomicState::new(state),
        rate: numbers.rate,
        period_us: numbers.period_us,
        burst: numbers.burst,
        database: current_database(),
        policy_tag: tag,
        used: kind,
        algorithm: numbers.algorithm.code(),
        id_len: prefix_len,
        id_truncated: u8::from(usize::from(prefix_len) < id.len()),
        id_prefix: prefix,
    }
}

/// The first bytes of `id` (at most [`ID_PREFIX`], cut at a character boundary) and their length.
fn id_prefix(id: &str) -> ([u8; ID_PREFIX], u8) {
    let mut end = id.len().min(ID_PREFIX);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    let mut prefix = [0u8; ID_PREFIX];
    prefix[..end].copy_from_slice(&id.as_bytes()[..end]);
    (prefix, end as u8)
}

fn full_error(function: &'static str, max_buckets: u32) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
        "the rate_limit memory store is full",
        function,
    )
    .set_detail(format!(
        "No bucket could be evicted: none is full and rate_limit.on_full = 'error' (rate_limit.max_buckets = \
         {max_buckets})."
    ))
    .set_hint(
        "Raise rate_limit.max_buckets (takes a restart), or set rate_limit.on_full = 'evict_oldest'.",
    )
}

/// Which buckets a purge looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PurgeScope {
    /// The buckets of the current database (`rate_limit.purge()`, which counts what it deleted there).
    CurrentDatabase,
    /// Every bucket of the server (the background worker).
    AllDatabases,
}

/// Deletes every bucket in `scope` that is full now; returns how many.
pub fn purge(function: &'static str, scope: PurgeScope) -> Result<i64, ErrorReport> {
    let table = Table::attach(function)?;
    let database = current_database();
    let in_scope = |s: &Slot| scope == PurgeScope::AllDatabases || s.database == database;
    let mut purged = 0i64;
    for p in 0..table.header.partitions {
        let mut part = table.lock_exclusive(p);
        let now = table.now();
        let mut i = 0;
        while i < part.slots.len() {
            let s = &part.slots[i];
            if s.used != 0 && in_scope(s) && slot_is_full(s, now) {
                part.remove(i); // an entry may have moved into i: look at i again
                purged += 1;
            } else {
                i += 1;
            }
        }
    }
    Ok(purged)
}

/// Calls `each(slot, now, wall_offset)` for every slot of the current database, outside the locks: each
/// partition's slots are copied out under its shared lock into a buffer that never grows there (no
/// allocation while locked). `now` is on the store's clock; add `wall_offset` to show an instant on the
/// wall clock. Does nothing when the library is not preloaded.
fn for_each_slot(function: &'static str, mut each: impl FnMut(&Slot, i64, i64)) {
    let Ok(table) = Table::attach(function) else {
        return;
    };
    let mut copied: Vec<Slot> = Vec::with_capacity(table.header.slots_per_partition as usize);
    let database = current_database();
    for p in 0..table.header.partitions {
        copied.clear();
        let now = {
            let part = table.lock_shared(p);
            copied.extend(
                part.slots
                    .iter()
                    .filter(|s| s.used != 0 && s.database == database)
                    .cloned(),
            );
            table.now()
        };
        let offset = table.wall_offset();
        for s in &copied {
            each(s, now, offset);
        }
    }
}

/// A slot's key for display: its first bytes, followed by `…` when it was longer than [`ID_PREFIX`].
fn shown_key(s: &Slot) -> String {
    let mut key = String::from_utf8_lossy(&s.id_prefix[..s.id_len as usize]).into_owned();
    if s.id_truncated != 0 {
        key.push('…');
    }
    key
}

/// Size and use of the memory store.
pub struct Usage {
    /// `rate_limit.max_buckets` at server start.
    pub max_buckets: i64,
    /// Buckets stored now.
    pub buckets: i64,
    /// Partitions (locks).
    pub partitions: i64,
    /// Slots (max_buckets plus 25% headroom).
    pub slots: i64,
    /// Bytes of one slot.
    pub slot_bytes: i64,
    /// Shared memory of the whole table.
    pub total_bytes: i64,
    /// `total_bytes / max_buckets`.
    pub bytes_per_bucket: i64,
    /// Buckets evicted because they were full (no information lost).
    pub lossless_evictions: i64,
    /// Buckets evicted by `on_full = 'evict_oldest'`.
    pub lossy_evictions: i64,
    /// Calls refused with 53200.
    pub refused_full: i64,
}

/// Reports the memory store's size and use.
pub fn usage(function: &'static str) -> Result<Usage, ErrorReport> {
    let table = Table::attach(function)?;
    let h = table.header;
    let g = Geometry {
        partitions: h.partitions,
        limit_per_partition: h.limit_per_partition,
        slots_per_partition: h.slots_per_partition,
    };
    let mut buckets = 0i64;
    for p in 0..h.partitions {
        buckets += i64::from(table.lock_shared(p).header.count);
    }
    let total = g.segment_bytes() as i64;
    Ok(Usage {
        max_buckets: i64::from(h.max_buckets),
        buckets,
        partitions: i64::from(h.partitions),
        slots: i64::from(h.partitions) * i64::from(h.slots_per_partition),
        slot_bytes: SLOT_BYTES as i64,
        total_bytes: total,
        bytes_per_bucket: total / i64::from(h.max_buckets.max(1)),
        lossless_evictions: h.lossless_evictions.load(Ordering::Relaxed) as i64,
        lossy_evictions: h.lossy_evictions.load(Ordering::Relaxed) as i64,
        refused_full: h.refused_full.load(Ordering::Relaxed) as i64,
    })
}

/// The slot's bucket as stored (state and numbers), if its numbers are valid.
fn stored_of(slot: &Slot) -> Option<Stored> {
    slot_policy(slot).map(|policy| Stored {
        state: slot_state(slot),
        policy,
    })
}

/// Locked partitions of one call, in ascending partition order (the global lock order: two calls that
/// lock several partitions cannot deadlock).
struct Locked<'a> {
    partitions: [u32; MAX_TARGETS],
    guards: Vec<ExclusiveGuard<'a>>,
}

impl<'a> Locked<'a> {
    /// Locks the distinct partitions of `parts` exclusively, lowest first. Allocates before locking.
    fn lock(table: &'a Table, parts: &[u32]) -> Locked<'a> {
        let mut sorted = [u32::MAX; MAX_TARGETS];
        sorted[..parts.len()].copy_from_slice(parts);
        sorted[..parts.len()].sort_unstable();
        let mut partitions = [u32::MAX; MAX_TARGETS];
        let mut n = 0;
        for &p in &sorted[..parts.len()] {
            if n == 0 || partitions[n - 1] != p {
                partitions[n] = p;
                n += 1;
            }
        }
        let mut guards = Vec::with_capacity(n);
        for &p in &partitions[..n] {
            guards.push(table.lock_exclusive(p));
        }
        Locked { partitions, guards }
    }

    fn guard(&mut self, partition: u32) -> &mut ExclusiveGuard<'a> {
        let i = self.partitions[..self.guards.len()]
            .iter()
            .position(|&p| p == partition)
            .unwrap_or(0);
        &mut self.guards[i]
    }
}

/// Takes `cost` tokens from every target (policy and ad-hoc buckets), all or nothing, under the locks of
/// all their partitions: either every bucket is charged or none is.
pub fn take_targets(
    function: &'static str,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<Vec<Outcome>, ErrorReport> {
    let table = Table::attach(function)?;
    let n = targets.len();
    if n > MAX_TARGETS {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("a call may name at most {MAX_TARGETS} buckets, got {n}"),
            function,
        )
        .set_hint("Split the limits over several calls."));
    }
    let mut hashes = [[0u64; 2]; MAX_TARGETS];
    let mut parts = [0u32; MAX_TARGETS];
    for (i, t) in targets.iter().enumerate() {
        hashes[i] = table.bucket_hash(&t.namespace, t.key);
        parts[i] = table.partition_of(&hashes[i]);
        table.prefetch(&hashes[i]);
    }
    if cost == 0 {
        // a peek: each bucket under its partition's shared lock, writing nothing
        let mut outcomes = Vec::with_capacity(n);
        for (i, t) in targets.iter().enumerate() {
            let part = table.lock_shared(parts[i]);
            let now = table.now();
            let stored = match part.probe(&hashes[i]) {
                Probe::Found(idx) => stored_of(&part.slots[idx]),
                Probe::Empty(_) => None,
            };
            drop(part);
            outcomes.push(t.evaluate(stored, now, 0));
        }
        return Ok(outcomes);
    }
    if let ([target], true) = (targets, AtomicState::swaps_are_lock_free()) {
        if let Some(outcome) = take_shared(&table, target, &hashes[0], parts[0], cost) {
            return Ok(vec![outcome]);
        }
    }
    let on_full = gucs::on_full();
    let mut outcomes = Vec::with_capacity(n);
    let mut locked = Locked::lock(&table, &parts[..n]);
    let now = table.now();
    for (i, t) in targets.iter().enumerate() {
        let g = locked.guard(parts[i]);
        let stored = match g.probe(&hashes[i]) {
            Probe::Found(idx) => stored_of(&g.slots[idx]),
            Probe::Empty(_) => None,
        };
        outcomes.push(t.evaluate(stored, now, cost));
    }
    if !outcomes.iter().all(|o| o.allowed) {
        return Ok(outcomes);
    }
    // Room for the new buckets first, so that nothing is written unless everything can be.
    for (i, _) in targets.iter().enumerate() {
        let g = locked.guard(parts[i]);
        let missing = (0..n)
            .filter(|&j| parts[j] == parts[i] && matches!(g.probe(&hashes[j]), Probe::Empty(_)))
            .count() as u32;
        while g.header.count + missing > g.limit {
            if !g.make_room(now, on_full, table.header, &hashes[..n]) {
                drop(locked);
                table.header.refused_full.fetch_add(1, Ordering::Relaxed);
                return Err(full_error(function, table.header.max_buckets));
            }
        }
    }
    for (i, t) in targets.iter().enumerate() {
        let g = locked.guard(parts[i]);
        let numbers = Numbers::of_policy(&t.policy);
        match g.probe(&hashes[i]) {
            Probe::Found(idx) => {
                let slot = &mut g.slots[idx];
                slot.state.store(outcomes[i].state);
                numbers.write_to(slot);
            }
            Probe::Empty(idx) => {
                let tag = match t.namespace {
                    Namespace::Policy { name, created_at } => policy_tag(name, created_at),
                    Namespace::AdHoc | Namespace::Request => 0,
                };
                let slot = new_slot(
                    hashes[i],
                    kind_of(&t.namespace),
                    tag,
                    t.key,
                    numbers,
                    outcomes[i].state,
                );
                g.insert(idx, slot);
            }
        }
    }
    Ok(outcomes)
}

/// Takes `cost` tokens from one existing bucket under its partition's SHARED lock, by compare-and-swap
/// ([`swap_take`]). `None` when the bucket must be written under the exclusive lock: it does not exist
/// yet (insert), or it was written under other numbers (they are converted and rewritten with the state).
fn take_shared(
    table: &Table,
    target: &Target<'_>,
    hash: &[u64; 2],
    partition: u32,
    cost: i64,
) -> Option<Outcome> {
    let part = table.lock_shared(partition);
    let Probe::Found(idx) = part.probe(hash) else {
        return None;
    };
    let slot = &part.slots[idx];
    let stored = slot_policy(slot).filter(|p| *p == target.policy)?;
    Some(swap_take(&slot.state, stored, target, cost, || table.now()).outcome)
}

/// What [`swap_take`] decided: the outcome, the state it was decided on (the one replaced on a grant) and
/// the instant it was evaluated at.
struct Swap {
    outcome: Outcome,
    #[cfg_attr(not(test), allow(dead_code))]
    replaced: State,
    #[cfg_attr(not(test), allow(dead_code))]
    now: i64,
}

/// Takes `cost` tokens from the bucket whose state is `state` (written under the numbers `stored`, those of
/// `target`): evaluates the state it loads at `clock()` and swaps in the result if the state is still the
/// one evaluated, else starts again from the newer state. A denial writes nothing. Each grant is thus
/// decided on the state it replaces, exactly as if the calls had run one after another in the order of
/// their swaps; an instant never moves back (a call that read the clock just before another one's swap
/// evaluates at the stored instant, as no time elapsed).
/// Says which state the decision replaced and the instant used (the model tests check both).
fn swap_take(
    state: &AtomicState,
    stored: Policy,
    target: &Target<'_>,
    cost: i64,
    clock: impl Fn() -> i64,
) -> Swap {
    loop {
        let current = state.load();
        let now = clock().max(current.at);
        let outcome = target.evaluate(
            Some(Stored {
                state: current,
                policy: stored,
            }),
            now,
            cost,
        );
        if !outcome.allowed || state.swap_if(current, outcome.state) {
            return Swap {
                outcome,
                replaced: current,
                now,
            };
        }
    }
}

/// Puts up to `tokens` back into a policy bucket (capped at its capacity); returns it afterwards.
pub fn refund_target(
    function: &'static str,
    target: &Target<'_>,
    tokens: i64,
) -> Result<Outcome, ErrorReport> {
    let table = Table::attach(function)?;
    let hash = table.bucket_hash(&target.namespace, target.key);
    let mut part = table.lock_exclusive(table.partition_of(&hash));
    let now = table.now();
    let Probe::Found(idx) = part.probe(&hash) else {
        return Ok(target.evaluate(None, now, 0)); // missing: full, nothing to put back
    };
    let slot = &mut part.slots[idx];
    let state = target.refunded(stored_of(slot), now, tokens);
    slot.state.store(state);
    Numbers::of_policy(&target.policy).write_to(slot);
    Ok(target.policy.take(state, now, 0))
}

/// Deletes a bucket (it is full again); true if it existed.
pub fn reset(
    function: &'static str,
    namespace: &Namespace<'_>,
    key: &str,
) -> Result<bool, ErrorReport> {
    let table = Table::attach(function)?;
    let hash = table.bucket_hash(namespace, key);
    let mut part = table.lock_exclusive(table.partition_of(&hash));
    Ok(match part.probe(&hash) {
        Probe::Found(idx) => {
            part.remove(idx);
            true
        }
        Probe::Empty(_) => false,
    })
}

/// One bucket of the memory store, for `rate_limit.buckets`.
pub struct Listed {
    /// `policy`, `ad_hoc` or `request`.
    pub kind: &'static str,
    /// The tag of the policy incarnation (0 for the other kinds), see [`policy_tag`].
    pub policy_tag: u32,
    /// The key, or its first bytes followed by `…`.
    pub key: String,
    /// Tokens now, in millionths (rounded down).
    pub millionths: i64,
    /// The numbers the bucket was last written under.
    pub policy: Policy,
    /// Last update, in microseconds on the wall clock.
    pub updated_at: i64,
}

/// Every bucket of the memory store in this database; empty when not preloaded.
pub fn list() -> Vec<Listed> {
    let mut rows = Vec::new();
    for_each_slot("rate_limit.buckets", |s, now, wall_offset| {
        let kind = match s.used {
            KIND_POLICY => "policy",
            KIND_AD_HOC => "ad_hoc",
            _ => "request",
        };
        if let Some(policy) = slot_policy(s) {
            rows.push(Listed {
                kind,
                policy_tag: s.policy_tag,
                key: shown_key(s),
                millionths: policy.tokens_millionths(slot_state(s), now),
                policy,
                updated_at: slot_state(s).at.saturating_add(wall_offset),
            });
        }
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicI64;
    use std::sync::Mutex;

    const S: i64 = 1_000_000;

    fn target(policy: Policy) -> Target<'static> {
        Target {
            namespace: Namespace::AdHoc,
            key: "k",
            policy,
            changed_at: i64::MIN,
        }
    }

    /// Eight threads race for the 1 000 tokens of one bucket at a fixed instant: exactly 1 000 are granted
    /// and the word ends where 1 000 serial takes end.
    #[test]
    fn swaps_grant_exactly_the_tokens_there_are() {
        assert!(
            AtomicState::swaps_are_lock_free(),
            "this CPU has no lock-free 128-bit CAS"
        );
        let policy = Policy::new(Algorithm::TokenBucket, 1, 3600 * S, 1000).unwrap();
        let state = AtomicState::new(policy.full(0));
        let t = target(policy);
        let granted = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..500 {
                        if swap_take(&state, policy, &t, 1, || 0).outcome.allowed {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(granted.load(Ordering::Relaxed), 1000);
        let mut serial = policy.full(0);
        for _ in 0..1000 {
            serial = policy.take(serial, 0, 1).state;
        }
        assert_eq!(state.load(), serial);
        assert!(!policy.take(serial, 0, 1).allowed);
    }

    /// With a clock that moves on at every reading, the grants of eight threads form one chain of swaps from
    /// the initial state: no two grants replaced the same state (no lost update), every grant is in the
    /// chain, and every link is exactly the model's step from the state it replaced at the instant it used.
    #[test]
    fn swaps_form_one_chain_of_exact_steps() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            let policy = Policy::new(algorithm, 5, 1000, 5).unwrap();
            let initial = policy.full(0);
            let state = AtomicState::new(initial);
            let t = target(policy);
            let clock = AtomicI64::new(0);
            let grants: Mutex<Vec<Swap>> = Mutex::new(Vec::new());
            std::thread::scope(|scope| {
                for _ in 0..8 {
                    scope.spawn(|| {
                        for _ in 0..2000 {
                            let swap = swap_take(&state, policy, &t, 1, || {
                                clock.fetch_add(1, Ordering::Relaxed)
                            });
                            if swap.outcome.allowed {
                                grants.lock().unwrap().push(swap);
                            }
                        }
                    });
                }
            });
            let grants = grants.into_inner().unwrap();
            let by_replaced: HashMap<State, &Swap> =
                grants.iter().map(|g| (g.replaced, g)).collect();
            assert_eq!(
                by_replaced.len(),
                grants.len(),
                "{algorithm:?}: two grants replaced one state"
            );
            let mut current = initial;
            let mut links = 0;
            while let Some(g) = by_replaced.get(&current) {
                assert!(g.now >= current.at, "{algorithm:?}: an instant moved back");
                let step = policy.take(current, g.now, 1);
                assert!(step.allowed);
                assert_eq!(
                    step.state, g.outcome.state,
                    "{algorithm:?}: not the model's step"
                );
                current = g.outcome.state;
                links += 1;
            }
            assert_eq!(
                current,
                state.load(),
                "{algorithm:?}: the chain does not end at the word"
            );
            assert_eq!(
                links,
                grants.len(),
                "{algorithm:?}: grants outside the chain"
            );
            assert!(
                links > 5,
                "{algorithm:?}: refill should grant more than the burst"
            );
        }
    }

    /// A partition of 8 buckets in 11 slots, holding the key `k` under the hash (k, k).
    fn slot(key: u64, state: State, policy: &Policy) -> Slot {
        let mut s = Slot {
            hash: [key, key],
            state: AtomicState::new(state),
            rate: 0,
            period_us: 0,
            burst: 0,
            database: 1,
            policy_tag: 0,
            used: KIND_AD_HOC,
            algorithm: 0,
            id_len: 0,
            id_truncated: 0,
            id_prefix: [0; ID_PREFIX],
        };
        Numbers::of_policy(policy).write_to(&mut s);
        s
    }

    fn empty_slot() -> Slot {
        let mut s = slot(
            0,
            State { level: 0, at: 0 },
            &Policy::new(Algorithm::TokenBucket, 1, S, 1).unwrap(),
        );
        s.used = 0;
        s
    }

    fn stats() -> Header {
        Header {
            seed: [0; 2],
            clock_base: 0,
            partitions: 1,
            slots_per_partition: 11,
            limit_per_partition: 8,
            max_buckets: 8,
            locks: ptr::null_mut(),
            lossless_evictions: AtomicU64::new(0),
            lossy_evictions: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, bool),
        Remove(u64),
        MakeRoom,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..40, any::<bool>()).prop_map(|(k, full)| Op::Insert(k, full)),
            2 => (0u64..40).prop_map(Op::Remove),
            1 => Just(Op::MakeRoom),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// The slot table (linear probing, backward-shift deletion, eviction from a moving hand) against a
        /// map: after every operation each key of the map is found with its state, no other key is found,
        /// and the count is the number of used slots.
        #[test]
        fn slot_table_behaves_like_a_map(ops in prop::collection::vec(op(), 1..200)) {
            let policy = Policy::new(Algorithm::TokenBucket, 1, S, 10).unwrap();
            let full = policy.full(0);
            let short = policy.take(full, 0, 3).state;
            let mut header = PartitionHeader { count: 0, hand: 0 };
            let mut slots: Vec<Slot> = (0..11).map(|_| empty_slot()).collect();
            let mut part = Partition { header: &mut header, slots: &mut slots, limit: 8 };
            let stats = stats();
            let mut model: HashMap<u64, State> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, is_full) => {
                        let state = if is_full { full } else { short };
                        match part.probe(&[k, k]) {
                            Probe::Found(i) => {
                                part.slots[i].state.store(state);
                                model.insert(k, state);
                            }
                            Probe::Empty(i) if part.header.count < part.limit => {
                                part.insert(i, slot(k, state, &policy));
                                model.insert(k, state);
                            }
                            Probe::Empty(_) => {}
                        }
                    }
                    Op::Remove(k) => {
                        if let Probe::Found(i) = part.probe(&[k, k]) {
                            part.remove(i);
                        }
                        model.remove(&k);
                    }
                    Op::MakeRoom => {
                        let before = part.header.count;
                        let freed = part.make_room(0, OnFull::EvictOldest, &stats, &[]);
                        prop_assert_eq!(freed, before > 0);
                        if freed {
                            let gone: Vec<u64> = model
                                .keys()
                                .copied()
                                .filter(|k| matches!(part.probe(&[*k, *k]), Probe::Empty(_)))
                                .collect();
                            prop_assert_eq!(gone.len(), 1);
                            let evicted_full = model.remove(&gone[0]) == Some(full);
                            // a full bucket is evicted whenever one lies in the slots examined (all 11 here)
                            prop_assert!(evicted_full || !model.values().any(|s| *s == full));
                        }
                    }
                }
                prop_assert_eq!(part.header.count as usize, model.len());
                prop_assert_eq!(part.slots.iter().filter(|s| s.used != 0).count(), model.len());
                for k in 0..40u64 {
                    match (part.probe(&[k, k]), model.get(&k)) {
                        (Probe::Found(i), Some(state)) => prop_assert_eq!(part.slots[i].state.load(), *state),
                        (Probe::Empty(_), None) => {}
                        (_, expected) => prop_assert!(false, "key {} expected {:?}", k, expected),
                    }
                }
            }
        }
    }

    #[test]
    fn geometry_fits_128_bytes_per_bucket() {
        assert_eq!(SLOT_BYTES, 96);
        for max in [64u32, 1000, 100_000, 1_000_000, 10_000_000] {
            let g = Geometry::for_max_buckets(max);
            assert!(g.partitions >= 1 && g.partitions <= 128);
            assert!(g.partitions * g.limit_per_partition >= max);
            assert!(g.slots_per_partition > g.limit_per_partition);
            let per_bucket = g.segment_bytes() as f64 / f64::from(max);
            assert!(per_bucket <= 128.0, "{max}: {per_bucket} bytes per bucket");
        }
    }

    #[test]
    fn id_prefix_cuts_at_a_character_boundary() {
        let (p, n) = id_prefix("short");
        assert_eq!(&p[..n as usize], b"short");
        let long = "é".repeat(30); // 60 bytes
        let (p, n) = id_prefix(&long);
        assert_eq!(n, 28);
        assert!(std::str::from_utf8(&p[..n as usize]).is_ok());
        let odd = format!("a{}", "é".repeat(30)); // the 28th byte falls inside a character
        let (p, n) = id_prefix(&odd);
        assert_eq!(n, 27);
        assert!(std::str::from_utf8(&p[..n as usize]).is_ok());
    }
}
