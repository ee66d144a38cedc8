//! The memory store's shared-memory segment: its layout ([`Geometry`]), its request and creation, and the
//! attached [`Table`] that every operation starts from (clock, keyed hash, partition locks).
//!
//! Layout: a [`Header`], then one [`PartitionHeader`] per partition, then the two owner-count tables
//! (databases, roles: [`shares::table_len`] entries each) of every partition, then the slots of every
//! partition one after another, each part aligned to a cache line. The header is written once, in the shmem startup
//! hook under AddinShmemInitLock, and only read afterwards (its counters are atomics).

use std::ffi::CStr;
use std::hash::Hasher;
use std::ptr;
use std::sync::atomic::AtomicU64;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;
use siphasher::sip128::{Hasher128, SipHasher13};

use super::hand_blocks::HandBlocks;
use super::slots::{kind_of, Evictions, PartitionHeader, Slot};
use crate::gucs;
use crate::shmem;
use crate::time::clock;
use rate_limit_model::shares::{self, Count};
use rate_limit_model::target::Namespace;

const SEGMENT_NAME: &CStr = c"rate_limit memory store";
const TRANCHE_NAME: &CStr = c"rate_limit";

/// The start of the segment; fixed after creation except for the atomics.
#[repr(C)]
pub(super) struct Header {
    pub seed: [u64; 2],
    /// Wall-clock microseconds minus monotonic microseconds when the segment was created.
    pub clock_base: i64,
    pub partitions: u32,
    pub slots_per_partition: u32,
    pub limit_per_partition: u32,
    pub max_buckets: u32,
    pub locks: *mut pg_sys::LWLockPadded,
    pub evictions: Evictions,
    pub refused_full: AtomicU64,
    /// The policies a key of which was blocked by hand in this store since it started (every policy when
    /// a block bucket was loaded at start): calls read the block buckets of a policy without a penalty
    /// box only then.
    pub hand_blocks: HandBlocks,
}

impl Header {
    fn geometry(&self) -> Geometry {
        Geometry {
            partitions: self.partitions,
            limit_per_partition: self.limit_per_partition,
            slots_per_partition: self.slots_per_partition,
        }
    }
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

    fn owners_offset(&self) -> usize {
        (Self::partition_headers_offset() + self.partitions as usize * size_of::<PartitionHeader>())
            .next_multiple_of(64)
    }

    /// Entries of each of a partition's two owner-count tables.
    pub fn owner_table_len(&self) -> usize {
        shares::table_len(self.limit_per_partition)
    }

    fn slots_offset(&self) -> usize {
        (self.owners_offset()
            + self.partitions as usize * 2 * self.owner_table_len() * size_of::<Count>())
        .next_multiple_of(64)
    }

    /// Bytes of shared memory the table needs.
    pub fn segment_bytes(&self) -> usize {
        self.slots_offset()
            + self.partitions as usize * self.slots_per_partition as usize * size_of::<Slot>()
    }
}

/// The segment, once attached; copied into every backend by fork.
pub(super) static mut SEGMENT: *mut Header = ptr::null_mut();

fn configured_geometry() -> Geometry {
    Geometry::for_max_buckets(gucs::max_buckets().max(1) as u32)
}

/// Requests the segment and the partition locks (the shmem request phase calls it).
///
/// # Safety
/// Only in the postmaster while shared memory may still be requested.
pub unsafe fn request_shmem() {
    let g = configured_geometry();
    // SAFETY: the caller guarantees we are in the request phase; the name is a static C string.
    unsafe { shmem::request(g.segment_bytes(), Some((TRANCHE_NAME, g.partitions))) }
}

/// Creates or finds the segment (the shmem startup hook calls it, holding AddinShmemInitLock); returns
/// true if it was created (empty).
///
/// # Safety
/// Only from the shmem startup hook, with AddinShmemInitLock held and the space requested.
pub unsafe fn attach_or_create() -> bool {
    let g = configured_geometry();
    // SAFETY: the caller's contract is shmem::attach's; the segment was sized by request_shmem.
    let (segment, created) = unsafe { shmem::attach(SEGMENT_NAME, g.segment_bytes()) };
    let segment = segment.cast::<Header>();
    if created {
        // SAFETY: the segment was just zeroed by shmem::attach and is at least a Header long; nobody else
        // sees it before the startup hook returns; the tranche was requested with `partitions` locks.
        unsafe {
            segment.write(Header {
                seed: shmem::random_seed(),
                clock_base: clock::now_us() - clock::monotonic_us(),
                partitions: g.partitions,
                slots_per_partition: g.slots_per_partition,
                limit_per_partition: g.limit_per_partition,
                max_buckets: gucs::max_buckets().max(1) as u32,
                locks: pg_sys::GetNamedLWLockTranche(TRANCHE_NAME.as_ptr()),
                evictions: Evictions::new(),
                refused_full: AtomicU64::new(0),
                hand_blocks: HandBlocks::new(),
            });
        }
    }
    // SAFETY: written only here, in the postmaster (or a backend of EXEC_BACKEND builds) before any call.
    unsafe { SEGMENT = segment };
    created
}

/// A bucket's hash: `namespace` (a [`Table::namespace_hasher`]) followed by the key.
pub fn key_hash(mut namespace: SipHasher13, key: &str) -> [u64; 2] {
    namespace.write(key.as_bytes());
    let h = namespace.finish128();
    [h.h1, h.h2]
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
pub(super) struct Table {
    pub header: &'static Header,
}

impl Table {
    /// The segment of this server; 55000 when the library was not preloaded.
    pub fn attach(function: &'static str) -> Result<Table, ErrorReport> {
        // SAFETY: SEGMENT is written only by shmem_startup in the postmaster before any backend exists,
        // then inherited read-only; a non-null pointer points at an initialised Header.
        let segment = unsafe { SEGMENT };
        if !shmem::preloaded() || segment.is_null() {
            return Err(not_preloaded(function));
        }
        // SAFETY: non-null and initialised (see above); the header is never freed while the server runs.
        let header = unsafe { &*segment };
        Ok(Table { header })
    }

    /// Now on the store's clock (monotonic, anchored to the wall clock at creation).
    pub fn now(&self) -> i64 {
        clock::monotonic_us() + self.header.clock_base
    }

    /// What to add to an instant of the store's clock to show it on the wall clock now.
    pub fn wall_offset(&self) -> i64 {
        clock::now_us() - self.now()
    }

    /// The keyed hash of a bucket: (database, kind, policy creation time, namespace, 0xFF, key). Buckets
    /// are per database, as in the table store; the kind byte separates the namespaces; 0xFF never occurs
    /// in UTF-8, so the namespace and the key cannot be confused.
    pub fn bucket_hash(&self, namespace: &Namespace<'_>, key: &str) -> [u64; 2] {
        key_hash(self.namespace_hasher(namespace), key)
    }

    /// The keyed hasher of [`Table::bucket_hash`] once it has taken in everything but the key: cloned for
    /// each key of a run over one namespace, it hashes only the key.
    pub fn namespace_hasher(&self, namespace: &Namespace<'_>) -> SipHasher13 {
        let mut hasher = SipHasher13::new_with_keys(self.header.seed[0], self.header.seed[1]);
        hasher.write_u32(crate::backend::current_database());
        hasher.write_u8(kind_of(namespace));
        hasher.write_i64(namespace.created_at());
        hasher.write(namespace.stored_name().as_bytes());
        hasher.write_u8(0xFF);
        hasher
    }

    /// The lock, header, owner-count tables (databases, then roles) and slots of partition `p`.
    ///
    /// # Safety
    /// `p < partitions`; the caller must hold the partition's lock before dereferencing the pointers.
    pub(super) unsafe fn partition(&self, p: u32) -> PartitionPointers {
        let h = self.header;
        let g = h.geometry();
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
            let owners = base
                .add(g.owners_offset())
                .cast::<Count>()
                .add(p as usize * 2 * g.owner_table_len())
                .cast_mut();
            let slots = base
                .add(g.slots_offset())
                .cast::<Slot>()
                .add(p as usize * g.slots_per_partition as usize)
                .cast_mut();
            PartitionPointers {
                lock,
                header,
                owners,
                owner_table_len: g.owner_table_len(),
                slots,
                slots_len: g.slots_per_partition,
            }
        }
    }

    /// The partition of a bucket.
    pub fn partition_of(&self, hash: &[u64; 2]) -> u32 {
        (hash[0] % u64::from(self.header.partitions)) as u32
    }

    /// The number of the slot where `hash`'s probe chain starts, counted over the whole segment (the
    /// partitions' slots lie one after another): buckets of nearer numbers lie nearer in memory.
    pub fn home_slot_number(&self, hash: &[u64; 2]) -> u64 {
        let slots_per_partition = u64::from(self.header.slots_per_partition);
        u64::from(self.partition_of(hash)) * slots_per_partition + hash[1] % slots_per_partition
    }

    /// How many slots the segment has: home slot numbers are below it.
    pub fn slot_count(&self) -> u64 {
        u64::from(self.header.partitions) * u64::from(self.header.slots_per_partition)
    }

    /// Bytes of the whole segment.
    pub fn segment_bytes(&self) -> usize {
        self.header.geometry().segment_bytes()
    }

    /// Starts loading the slot where `hash`'s probe chain starts into the CPU cache, before its partition
    /// is locked. With a large table that slot is nearly always a cache (and TLB) miss; issued for every
    /// bucket of a call first, the misses overlap each other and the lock acquisition instead of being
    /// served one by one under the lock.
    pub fn prefetch(&self, hash: &[u64; 2]) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let slots_per_partition = u64::from(self.header.slots_per_partition);
            // SAFETY: partition_of is below the partition count; the pointer is only computed, not
            // dereferenced, so no lock is needed.
            let slots = unsafe { self.partition(self.partition_of(hash)) }.slots;
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

/// Where one partition lies in the segment: valid pointers, to be dereferenced only under `lock`.
pub(super) struct PartitionPointers {
    pub lock: *mut pg_sys::LWLock,
    pub header: *mut PartitionHeader,
    /// `2 × owner_table_len` counts: the databases' table, then the roles'.
    pub owners: *mut Count,
    pub owner_table_len: usize,
    pub slots: *mut Slot,
    pub slots_len: u32,
}

impl PartitionPointers {
    /// The two owner tables (databases, roles) as raw slices.
    ///
    /// # Safety
    /// As for dereferencing the pointers: the caller holds the partition's lock.
    pub unsafe fn owner_tables(&self) -> (*mut [Count], *mut [Count]) {
        // SAFETY: the owners' region of a partition holds two tables of `owner_table_len` counts each
        // (Geometry's layout); only the pointers are computed here.
        let roles = unsafe { self.owners.add(self.owner_table_len) };
        (
            ptr::slice_from_raw_parts_mut(self.owners, self.owner_table_len),
            ptr::slice_from_raw_parts_mut(roles, self.owner_table_len),
        )
    }
}

/// Whether the session's login role is a superuser (not held to `rate_limit.role_share`).
pub(super) fn role_is_superuser() -> bool {
    // SAFETY: a catalog lookup of a valid role OID, in a backend inside a transaction (every memory-store
    // call runs in one).
    unsafe { pg_sys::superuser_arg(pg_sys::GetSessionUserId()) }
}
