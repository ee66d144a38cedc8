//! Every setting of the extension: a documented `static`, one `init()` that registers them, and small
//! accessors. `rate_limit.store` and `rate_limit.on_full` are registered whenever the library loads, so a
//! `SET` always validates its value; `rate_limit.max_buckets` (PGC_POSTMASTER) only when preloading, the
//! only time PostgreSQL allows it and the only time shared memory is requested.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// Where `rate_limiting_request`, `peek`, `reset` and `purge` keep bucket state.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Store {
    /// `rate_limit.bucket_state`: durable, replicated, transactional.
    #[name = c"table"]
    Table,
    /// The shared-memory hash table: no WAL, works in read-only transactions and on standbys.
    #[name = c"memory"]
    Memory,
}

/// What the memory store does when a new bucket does not fit and no full bucket can be evicted.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum OnFull {
    /// Raise 53200 (out_of_memory) with a hint to raise `rate_limit.max_buckets`.
    #[name = c"error"]
    Error,
    /// Evict the bucket of the partition updated longest ago (lossy: that id starts full again).
    #[name = c"evict_oldest"]
    EvictOldest,
}

/// `rate_limit.store`: `table` (default) or `memory`; settable per session, role and database.
pub static STORE: GucSetting<Store> = GucSetting::<Store>::new(Store::Table);

/// `rate_limit.on_full`: `error` (default) or `evict_oldest`; superuser-only, as eviction affects everyone.
pub static ON_FULL: GucSetting<OnFull> = GucSetting::<OnFull>::new(OnFull::Error);

/// Default of `rate_limit.max_buckets`: 100 000 buckets, about 11 MB of shared memory.
pub const DEFAULT_MAX_BUCKETS: i32 = 100_000;

/// `rate_limit.max_buckets`: buckets the memory store holds; fixed at server start.
pub static MAX_BUCKETS: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_MAX_BUCKETS);

/// Registers the settings. Called once from `_PG_init`; `preloading` tells whether the library is being
/// loaded through `shared_preload_libraries` (a PGC_POSTMASTER setting can only be defined then).
pub fn init(preloading: bool) {
    GucRegistry::define_enum_guc(
        c"rate_limit.store",
        c"Where rate_limit keeps bucket state: table or memory.",
        c"table: rate_limit.bucket_state, durable and transactional. memory: shared memory, needs \
          shared_preload_libraries = 'rate_limit', works in read-only transactions and on standbys.",
        &STORE,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"rate_limit.on_full",
        c"What the memory store does when full and no full bucket can be evicted: error or evict_oldest.",
        c"error raises 53200; evict_oldest drops the least recently updated bucket of the partition (lossy).",
        &ON_FULL,
        GucContext::Suset,
        GucFlags::default(),
    );
    if !preloading {
        return;
    }
    GucRegistry::define_int_guc(
        c"rate_limit.max_buckets",
        c"How many buckets the memory store holds.",
        c"Sizes the shared-memory table at server start (about 110 bytes per bucket).",
        &MAX_BUCKETS,
        64,
        i32::MAX / 2,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

/// The store selected for this call.
pub fn store() -> Store {
    STORE.get()
}

/// The full-table policy of the memory store.
pub fn on_full() -> OnFull {
    ON_FULL.get()
}

/// The configured capacity of the memory store.
pub fn max_buckets() -> i32 {
    MAX_BUCKETS.get()
}
