//! Every setting of the extension: a documented `static`, one `init()` that registers them, and small
//! accessors. Every setting is registered whenever the library loads, so a `SET` always validates its
//! value, except the PGC_POSTMASTER ones (`rate_limit.max_buckets`, `rate_limit.stats_max`,
//! `rate_limit.override_filter_mb`): only when
//! preloading, the only time PostgreSQL allows them and the only time shared memory is requested.

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

impl Store {
    /// Its name, as `rate_limit.store` and the policies' `store` column spell it.
    pub fn name(self) -> &'static str {
        match self {
            Store::Table => "table",
            Store::Memory => "memory",
        }
    }
}

/// What the memory store does when a new bucket does not fit and no full bucket can be evicted.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum OnFull {
    /// Raise 53200 (out_of_memory) with a hint to raise `rate_limit.max_buckets`.
    #[name = c"error"]
    Error,
    /// Evict the database's own bucket updated longest ago, within its share (lossy: that key starts full
    /// again, so its limit is reset).
    #[name = c"evict_oldest"]
    EvictOldest,
}

/// `rate_limit.store`: `table` (default) or `memory`; settable per session, role and database.
pub static STORE: GucSetting<Store> = GucSetting::<Store>::new(Store::Table);

/// `rate_limit.on_full`: `error` (default) or `evict_oldest`; superuser-only, as eviction affects everyone.
pub static ON_FULL: GucSetting<OnFull> = GucSetting::<OnFull>::new(OnFull::Error);

/// Default of `rate_limit.database_share`: half of the memory store, so that two databases are isolated
/// from each other with no setting at all.
pub const DEFAULT_DATABASE_SHARE: i32 = 50;

/// `rate_limit.database_share` (percent): how much of the memory store (of each of its partitions) the
/// buckets of one database may fill. Superuser-only; per database with `ALTER DATABASE … SET`.
pub static DATABASE_SHARE: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_DATABASE_SHARE);

/// Default of `rate_limit.role_share`: half of the memory store, so that one role, from any number of
/// databases, leaves every other role at least the other half.
pub const DEFAULT_ROLE_SHARE: i32 = 50;

/// `rate_limit.role_share` (percent): how much of the memory store (of each of its partitions) the buckets
/// of one login role may fill, over every database. Superuser-only; per role with `ALTER ROLE … SET`.
/// Superusers' sessions are not held to it.
pub static ROLE_SHARE: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_ROLE_SHARE);

/// Default of `rate_limit.max_refill_time`: one day.
pub const DEFAULT_MAX_REFILL_TIME: i32 = 86_400;

/// `rate_limit.max_refill_time` (seconds): the longest an ad-hoc or `rate_limiting_request` bucket may take
/// to refill from empty, unless the caller has the privileges of the extension's owner (named policies,
/// made by the owner, are not bounded). A bucket that never refills could never be purged.
pub static MAX_REFILL_TIME: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_MAX_REFILL_TIME);

/// Default of `rate_limit.max_policy_refill_time`: 400 days (a yearly calendar quota fits).
pub const DEFAULT_MAX_POLICY_REFILL_TIME: i32 = 400 * 1_440;

/// `rate_limit.max_policy_refill_time` (minutes, so that it reaches past a century): the longest a named policy's bucket may stay short of full
/// after any role's last call (emptied and charged to `max_debt`, or blocked by its penalty box), checked
/// when the owner creates or changes the policy (see [`crate::bounds::policy`]). Superuser-only.
pub static MAX_POLICY_REFILL_TIME: GucSetting<i32> =
    GucSetting::<i32>::new(DEFAULT_MAX_POLICY_REFILL_TIME);

/// Default of `rate_limit.max_wait`: 30 seconds.
pub const DEFAULT_MAX_WAIT_MS: i32 = 30_000;

/// `rate_limit.max_wait` (milliseconds): the longest `rate_limit.wait` sleeps, and its timeout when none is
/// given. Superuser-only: a waiting call holds its statement's snapshot.
pub static MAX_WAIT: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_MAX_WAIT_MS);

/// `rate_limit.metrics_top_keys`: the most denied keys per policy that `rate_limit.metrics_top_keys`
/// (the view) shows, so that a monitoring system gets at most this many key labels per policy; 0 (the
/// default) shows none. Superuser-only: it bounds what `pg_monitor` reads of the keys.
pub static METRICS_TOP_KEYS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Default of `rate_limit.max_buckets`: 100 000 buckets, about 11 MB of shared memory.
pub const DEFAULT_MAX_BUCKETS: i32 = 100_000;

/// `rate_limit.max_buckets`: buckets the memory store holds; fixed at server start.
pub static MAX_BUCKETS: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_MAX_BUCKETS);

/// Default of `rate_limit.stats_max`: statistics for 1 000 (database, policy) pairs, about 3 MB.
pub const DEFAULT_STATS_MAX: i32 = 1000;

/// `rate_limit.stats_max`: (database, namespace) pairs with statistics; fixed at server start.
pub static STATS_MAX: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_STATS_MAX);

/// Default of `rate_limit.override_filter_mb`: 4 MB, about 1% false positives with 3 million overrides.
pub const DEFAULT_OVERRIDE_FILTER_MB: i32 = 4;

/// `rate_limit.override_filter_mb`: the size of the shared-memory filter that tells a key without an
/// override from one that may have one (`policies::overrides::filter`); 0 turns it off. Fixed at server
/// start.
pub static OVERRIDE_FILTER_MB: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_OVERRIDE_FILTER_MB);

/// Default of `rate_limit.purge_interval`: 5 minutes. A purge reads the whole state table (about a second
/// of one core per million rows) and deletes the table store's buckets full and untouched for an interval;
/// a full bucket costs only its row until then: every 5 minutes keeps the table within two intervals of
/// idle buckets for well under 1% of a core.
pub const DEFAULT_PURGE_INTERVAL: i32 = 300;

/// `rate_limit.purge_interval` (seconds): how often the background worker purges full buckets (in the table
/// store, those untouched for that long); 0 disables.
pub static PURGE_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_PURGE_INTERVAL);

/// `rate_limit.memory_snapshot_interval` (seconds): how often the worker saves the memory store; 0 (the
/// default): only at a clean shutdown.
pub static MEMORY_SNAPSHOT_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(0);

/// `rate_limit.track_stats`: whether calls are counted in `rate_limit.stats` and `rate_limit.top_limited`
/// (default on; superuser-only, as the statistics belong to everyone).
pub static TRACK_STATS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `rate_limit.shadow`: every limit in shadow mode (default off): no call is denied, and every would-be
/// denial is reported (`shadow_denied`) and counted, as for a policy created with `shadow => true`. The
/// switch for an incident. Superuser-only, set in postgresql.conf, with ALTER SYSTEM or per database or
/// role: a role that could set it for its own session could lift every limit on itself.
pub static SHADOW: GucSetting<bool> = GucSetting::<bool>::new(false);

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
    GucRegistry::define_bool_guc(
        c"rate_limit.shadow",
        c"Puts every rate limit in shadow mode: no call is denied; would-be denials are reported and counted.",
        c"For incidents. Per policy, use rate_limit.alter_policy(name, shadow => true).",
        &SHADOW,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limit.database_share",
        c"Percentage of the memory store (of each of its partitions) that one database's buckets may fill.",
        c"Set per database with ALTER DATABASE ... SET; while the shares of the databases that use the \
          memory store add up to 100 or less, no database can fill or evict another's buckets.",
        &DATABASE_SHARE,
        1,
        100,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limit.role_share",
        c"Percentage of the memory store (of each of its partitions) that one login role's buckets may fill, \
          over every database.",
        c"Set per role with ALTER ROLE ... SET; superusers are not held to it. With 50, one role flooding \
          from any number of databases leaves every other role half of the store.",
        &ROLE_SHARE,
        1,
        100,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limit.metrics_top_keys",
        c"Most denied keys per policy shown by the rate_limit.metrics_top_keys view (0: none).",
        c"Each shown key becomes a label of a time series in a monitoring system scraping the view: keep \
          it small. Also the most of a policy's keys a member of pg_monitor can read.",
        &METRICS_TOP_KEYS,
        0,
        rate_limit_model::summary::TOP_KEYS as i32,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limit.max_refill_time",
        c"Longest time an ad-hoc or rate_limiting_request bucket may take to refill, for roles other than \
          the extension's owner.",
        c"A longer limit is refused with 22023. Named policies are not bounded.",
        &MAX_REFILL_TIME,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"rate_limit.max_policy_refill_time",
        c"Longest a named policy's bucket may stay short of full after any role's last call.",
        c"Checked when a policy is created or changed: emptied and charged to max_debt, or blocked by its \
          penalty box, its buckets must be full again within this, so the purge can delete them.",
        &MAX_POLICY_REFILL_TIME,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_MIN,
    );
    GucRegistry::define_int_guc(
        c"rate_limit.max_wait",
        c"Longest time rate_limit.wait sleeps, and its timeout when none is given.",
        c"A waiting call holds its statement's snapshot (and, with the table store, its lock on the state \
          table) while it sleeps; this bounds both.",
        &MAX_WAIT,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"rate_limit.track_stats",
        c"Whether rate_limit counts calls in rate_limit.stats and rate_limit.top_limited.",
        c"The counters live in shared memory (shared_preload_libraries); off saves their small cost.",
        &TRACK_STATS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limit.purge_interval",
        c"How often the rate_limit background worker deletes full buckets; 0 disables.",
        c"Full buckets are deleted losslessly (a missing bucket is a full one) from the memory store and, \
          once untouched for an interval, from rate_limit.bucket_state in every database. Needs \
          shared_preload_libraries.",
        &PURGE_INTERVAL,
        0,
        i32::MAX / 1000,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"rate_limit.memory_snapshot_interval",
        c"How often the memory store is saved to disk, so that a crash loses at most that much; 0: only \
          at a clean shutdown.",
        c"The snapshot is pg_stat/rate_limit.memory in the data directory, loaded at the next start.",
        &MEMORY_SNAPSHOT_INTERVAL,
        0,
        i32::MAX / 1000,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    if preloading {
        define_sizes();
    }
    reserve_prefix();
}

/// Reserves the `rate_limit.` prefix once every setting is defined: a misspelt one (`SET
/// rate_limit.max_wiat = …`) is an error (42602) instead of a placeholder that silently does nothing, and
/// placeholders set before the library loaded (in postgresql.conf, say) are reported and removed. On
/// PostgreSQL 13 and 14, which have no MarkGUCPrefixReserved, only those existing placeholders are
/// reported. When the library is not preloaded, the two sizes of shared memory are not defined, so a
/// `rate_limit.max_buckets` in postgresql.conf is reported: it has no effect there.
fn reserve_prefix() {
    #[cfg(any(feature = "pg13", feature = "pg14"))]
    // SAFETY: a static NUL-terminated name, in _PG_init, after the prefix's settings are defined.
    unsafe {
        pgrx::pg_sys::EmitWarningsOnPlaceholders(c"rate_limit".as_ptr())
    }
    #[cfg(not(any(feature = "pg13", feature = "pg14")))]
    // SAFETY: as above.
    unsafe {
        pgrx::pg_sys::MarkGUCPrefixReserved(c"rate_limit".as_ptr())
    }
}

/// The PGC_POSTMASTER settings, which size shared memory: defined only while preloading.
fn define_sizes() {
    GucRegistry::define_int_guc(
        c"rate_limit.max_buckets",
        c"How many buckets the memory store holds.",
        c"Sizes the shared-memory table at server start (about 136 bytes per bucket).",
        &MAX_BUCKETS,
        64,
        i32::MAX / 2,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limit.stats_max",
        c"How many (database, policy) pairs rate_limit keeps statistics for.",
        c"Each policy of each database, and rate_limiting_request and the ad-hoc limits of each database, \
          take one entry (about 3 KB) at their first call; calls beyond are counted as untracked.",
        &STATS_MAX,
        16,
        1_000_000,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limit.override_filter_mb",
        c"Megabytes of shared memory for the filter of keys that have a per-key override.",
        c"Calls of keys without an override read no row when the filter says so: about 10 bits per \
          override keep false positives near 1%. 0 turns the filter off (every call of a policy with \
          overrides reads its key's row).",
        &OVERRIDE_FILTER_MB,
        0,
        1024,
        GucContext::Postmaster,
        GucFlags::UNIT_MB,
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

/// The current role's share of the memory store, in percent (1 to 100).
pub fn role_share() -> u32 {
    ROLE_SHARE.get().clamp(1, 100) as u32
}

/// The current database's share of the memory store, in percent (1 to 100).
pub fn database_share() -> u32 {
    DATABASE_SHARE.get().clamp(1, 100) as u32
}

/// The longest refill time of a bucket made by a role without the owner's privileges, in microseconds.
pub fn max_refill_time_us() -> i64 {
    i64::from(MAX_REFILL_TIME.get().max(1)) * 1_000_000
}

/// The longest a named policy's bucket may stay short of full, in microseconds.
pub fn max_policy_refill_time_us() -> i64 {
    i64::from(MAX_POLICY_REFILL_TIME.get().max(1)) * 60_000_000
}

/// The longest `rate_limit.wait` sleeps, in microseconds.
pub fn max_wait_us() -> i64 {
    i64::from(MAX_WAIT.get().max(0)) * 1_000
}

/// The most denied keys per policy the metrics show (0 to the summary's size).
pub fn metrics_top_keys() -> usize {
    METRICS_TOP_KEYS.get().max(0) as usize
}

/// Whether every limit is in shadow mode (`rate_limit.shadow`).
pub fn shadow() -> bool {
    SHADOW.get()
}

/// Whether calls are counted in the statistics.
pub fn track_stats() -> bool {
    TRACK_STATS.get()
}

/// The purge interval in seconds (0: disabled).
pub fn purge_interval() -> i32 {
    PURGE_INTERVAL.get()
}

/// The memory store's snapshot interval in seconds (0: only at a clean shutdown).
pub fn memory_snapshot_interval() -> i32 {
    MEMORY_SNAPSHOT_INTERVAL.get()
}

/// The configured number of statistics entries.
pub fn stats_max() -> i32 {
    STATS_MAX.get()
}

/// The configured size of the overrides filter, in megabytes (0: none).
pub fn override_filter_mb() -> i32 {
    OVERRIDE_FILTER_MB.get()
}

/// The configured capacity of the memory store.
pub fn max_buckets() -> i32 {
    MAX_BUCKETS.get()
}
