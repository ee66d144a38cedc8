//! The memory store: buckets in a hash table in PostgreSQL's shared memory. No WAL, no table, nothing
//! transactional: it works in read-only transactions and on hot standbys. Its state is saved at a clean
//! shutdown and loaded at the next start ([`snapshot`]); a crash loses it (or goes back to the last
//! snapshot, with `rate_limit.memory_snapshot_interval`).
//!
//! Rooms: [`segment`] (layout, request, attach, clock, keyed hash), [`slots`] (one partition's slot table:
//! probe, insert, backward-shift delete, eviction), [`shares`] (how much one database and one role may
//! fill, in the model crate),
//! [`guards`] (the lock types), [`cas`] (the lock-free take), [`run`] (a batch's takes), [`multi`] (the
//! exclusive, all-or-nothing take), [`snapshot`] (restarts). This file holds the store's operations.
//!
//! Locking contract.
//! - The table is split into `partitions` partitions, each a fixed ring of slots with its own LWLock (tranche
//!   `rate_limit`), a header (bucket count, eviction hand) and two owner tables (buckets per database and per
//!   login role). A key's 128-bit hash
//!   picks its partition, so one bucket is under exactly one lock.
//! - Taking tokens from one existing bucket whose numbers are those of the call (the common case) holds the
//!   partition's lock SHARED and swaps the bucket's state word ([`cas`]). Inserting, evicting, deleting,
//!   refunds, a call on several buckets (all or nothing) and a bucket whose numbers changed hold the lock
//!   EXCLUSIVE, which excludes every swap. `peek`, listing and usage hold it SHARED and read the word
//!   atomically. Where the CPU has no lock-free 128-bit compare-and-swap, every take holds it EXCLUSIVE.
//! - A partition's counts (buckets, buckets per database and per role) change only under the EXCLUSIVE lock,
//!   together with the slots they count.
//! - The guard types enforce the rest: a shared guard only hands out `&[Slot]`, an exclusive one
//!   `&mut [Slot]`. While a lock is held nothing allocates, waits, does I/O, takes a lock of another kind or
//!   raises an error: errors are built after the locks are released. A call locks at most [`MAX_TARGETS`]
//!   partitions, lowest first (more targets are an error, never a truncation).
//! - The segment header (seed, sizes, lock pointers) is written once, in the shmem startup hook under
//!   AddinShmemInitLock, and only read afterwards. Its statistics are atomics, updated without a lock.
//!
//! Keys. A slot stores the 128-bit SipHash-1-3 of the id, keyed with a random seed drawn when the table is
//! created, so ids chosen by an attacker cannot be made to collide or pile up in one partition. Two distinct
//! ids share a bucket only if their keyed hashes collide: with n buckets the chance is below n² / 2^129
//! (for a million buckets, about 1.5e-27). The current database's OID is hashed with the id, so buckets
//! are per database, as in the table store. The first [`slots::ID_PREFIX`] bytes of the id are kept for display
//! in `rate_limit.buckets`; the id itself may be up to 2048 bytes, like in the table store.
//!
//! Room. Each partition holds at most `ceil(max_buckets / partitions)` buckets in 25% more slots, each
//! database at most its share of them and each login role at most its share over every database
//! ([`shares`]): a role, from any number of databases, cannot fill, evict or reset another role's buckets.
//! When a new bucket does not fit, a bucket that is full now is evicted first (lossless: a missing bucket
//! is a full one); failing that, `rate_limit.on_full` decides, among the caller's role's own buckets only. An insert examines at most [`slots::EVICTION_SCAN`] slots under its exclusive lock,
//! from a hand that moves on through the partition, so a flood of new keys costs a bounded time per call.
//!
//! Time. The store measures time on [`crate::time::clock::monotonic_us`], a clock that never steps, anchored to the wall
//! clock when the segment is created: while the server runs, wall-clock steps (NTP, VM restore) neither
//! mint tokens nor freeze buckets here; across a restart, `snapshot` converts instants through the wall
//! clock. Listings show instants converted to the wall clock of the moment of the listing.

mod atomic_state;
mod cas;
mod guards;
mod hand_blocks;
mod multi;
mod run;
mod segment;
mod slots;
mod snapshot;

use pgrx::pg_sys::panic::ErrorReport;

use crate::backend::{current_database, current_role};
use crate::gucs;
use atomic_state::AtomicState;
use cas::take_shared_at;
use rate_limit_model::algorithm::{Outcome, Policy, State};
use rate_limit_model::pipeline::PerTarget;
use rate_limit_model::shares;
use rate_limit_model::target::{evaluate_all, Ask, Kind, Namespace, Stored, Target, MAX_TARGETS};
use segment::{role_is_superuser, Table};
use slots::{
    kind_from_byte, shown_key, slot_is_full, slot_policy, stored_of, write_policy, Probe, Slot,
    KIND_POLICY,
};

pub use run::each_of_batch;
pub use segment::{attach_or_create, request_shmem};
pub use slots::{policy_tag, SLOT_BYTES};
pub use snapshot::{load as load_saved, save};

/// Whether the memory store exists (the library was preloaded).
pub fn available() -> bool {
    Table::attach("rate_limit").is_ok()
}

/// Now on the memory store's clock; 55000 when it is not available.
pub fn now(function: &'static str) -> Result<i64, ErrorReport> {
    Ok(Table::attach(function)?.now())
}

/// Notes that a key of `namespace` was blocked by hand in this store (see [`hand_blocks`]).
pub fn note_block_by_hand(
    function: &'static str,
    namespace: &Namespace<'_>,
) -> Result<(), ErrorReport> {
    let table = Table::attach(function)?;
    table.header.hand_blocks.note(current_database(), namespace);
    Ok(())
}

/// Whether a key of `namespace` may have been blocked by hand in this store (see [`hand_blocks`]).
pub fn blocks_by_hand(
    function: &'static str,
    namespace: &Namespace<'_>,
) -> Result<bool, ErrorReport> {
    let table = Table::attach(function)?;
    Ok(table
        .header
        .hand_blocks
        .may_hold(current_database(), namespace))
}

/// The bitmap of the policies that may hold a block by hand, now and as the saved store in the data
/// directory says (`None` without a saved file of the current format).
#[cfg(any(test, feature = "pg_test"))]
pub fn hand_blocks_now_and_saved() -> (Vec<u64>, Option<Vec<u64>>) {
    let now = Table::attach("rate_limit")
        .map(|t| t.header.hand_blocks.words().to_vec())
        .unwrap_or_default();
    (now, snapshot::saved_hand_blocks().map(|w| w.to_vec()))
}

/// Starts loading the bucket of every target into the CPU cache, so that calls answering them one after
/// another ([`take`] of one target each, e.g. a lease's slots) wait for one memory miss, not one each.
pub fn prefetch(function: &'static str, targets: &[Target<'_>]) -> Result<(), ErrorReport> {
    let table = Table::attach(function)?;
    for t in targets {
        table.prefetch(&table.bucket_hash(&t.namespace, t.key));
    }
    Ok(())
}

/// Answers `asks[i]` for `targets[i]`, every target (policy and ad-hoc buckets): takes tokens all or
/// nothing (every ask a take of 0 only reports, under shared locks, writing nothing), or charges them. One
/// existing bucket takes the lock-free path; everything else the exclusive one.
pub fn take(
    function: &'static str,
    targets: &[Target<'_>],
    asks: &[Ask],
) -> Result<PerTarget<Outcome>, ErrorReport> {
    let table = Table::attach(function)?;
    let n = targets.len();
    if n > MAX_TARGETS {
        return Err(multi::too_many_targets(function, n));
    }
    let mut hashes = [[0u64; 2]; MAX_TARGETS];
    let mut parts = [0u32; MAX_TARGETS];
    for (i, t) in targets.iter().enumerate() {
        hashes[i] = table.bucket_hash(&t.namespace, t.key);
        parts[i] = table.partition_of(&hashes[i]);
        table.prefetch(&hashes[i]);
    }
    if asks.iter().all(|a| a.only_reports()) {
        let mut stored: [Option<Stored>; MAX_TARGETS] = [None; MAX_TARGETS];
        let mut now = 0;
        for (i, s) in stored.iter_mut().enumerate().take(n) {
            let part = table.lock_shared(parts[i]);
            now = table.now();
            if let Probe::Found(idx) = part.probe(&hashes[i]) {
                *s = stored_of(&part.slots[idx]);
            }
        }
        return Ok(PerTarget::from_vec(evaluate_all(
            targets,
            &stored[..n],
            now,
            0,
        )));
    }
    if let ([target], [ask], true) = (targets, asks, AtomicState::swaps_are_lock_free()) {
        if let Some(outcome) =
            take_shared_at(&table, target, &hashes[0], parts[0], *ask, || table.now())
        {
            return Ok(PerTarget::from_slice(&[outcome]));
        }
    }
    multi::take_exclusive(function, &table, targets, &hashes[..n], &parts[..n], asks)
        .map(PerTarget::from_vec)
}

/// The memory store's lock-read-write step on one bucket: under its partition's exclusive lock, reads the
/// bucket, asks `step` what to write given the stored bucket and the store's clock, and writes that state
/// over the bucket if it exists (a missing bucket is full: nothing is inserted). `step` runs under the
/// lock: it must be pure arithmetic (no allocation, no error).
pub fn update<R>(
    function: &'static str,
    target: &Target<'_>,
    step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
) -> Result<R, ErrorReport> {
    let table = Table::attach(function)?;
    let hash = table.bucket_hash(&target.namespace, target.key);
    let mut part = table.lock_exclusive(table.partition_of(&hash));
    let found = match part.probe(&hash) {
        Probe::Found(idx) => Some(idx),
        Probe::Empty(_) => None,
    };
    let stored = found.and_then(|idx| stored_of(&part.slots[idx]));
    let (state, result) = step(stored, table.now());
    if let (Some(state), Some(idx)) = (state, found) {
        let slot = &mut part.slots[idx];
        slot.state.store(state);
        write_policy(slot, &target.policy);
    }
    Ok(result)
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

/// Which buckets a purge looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PurgeScope<'a> {
    /// The full buckets of the current database, and its buckets of the dropped policies whose tags
    /// ([`policy_tag`]) are in `dropped_policies` (`rate_limit.purge()` and the worker's round in a
    /// database).
    CurrentDatabase {
        /// Tags of policies whose drop has committed and that no live policy shares.
        dropped_policies: &'a [u32],
    },
    /// The full buckets of every database of the server, and every bucket of the databases in `dropped`
    /// (the background worker's round).
    Server {
        /// The OIDs of databases that held buckets and no longer exist.
        dropped: &'a [u32],
    },
}

/// Deletes every bucket in `scope` that is full now, and those of dropped policies or databases; returns
/// how many.
pub fn purge(function: &'static str, scope: PurgeScope<'_>) -> Result<i64, ErrorReport> {
    let table = Table::attach(function)?;
    let database = current_database();
    let mut purged = 0i64;
    for p in 0..table.header.partitions {
        let mut part = table.lock_exclusive(p);
        let now = table.now();
        purged += part.remove_where(|s| match scope {
            PurgeScope::CurrentDatabase { dropped_policies } => {
                s.database == database
                    && (slot_is_full(s, now)
                        || (s.used == KIND_POLICY && dropped_policies.contains(&s.policy_tag)))
            }
            PurgeScope::Server { dropped } => dropped.contains(&s.database) || slot_is_full(s, now),
        });
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
    // one mapping to the wall clock for the whole listing: read per partition, the two clocks' readings
    // jittered by a few microseconds between partitions, and two instants a slot apart showed a gap a few
    // microseconds off (bookings.rs)
    let offset = table.wall_offset();
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
        for s in &copied {
            each(s, now, offset);
        }
    }
}

/// One bucket of the memory store, as stored (the policy named by its tag).
pub struct Listed {
    /// What kind of bucket.
    pub kind: Kind,
    /// The tag of the policy incarnation (0 for the other kinds), see [`policy_tag`].
    pub policy_tag: u32,
    /// The key, or its first bytes followed by `…`.
    pub key: String,
    /// Tokens now, in millionths (rounded down).
    pub millionths: i64,
    /// The numbers the bucket was last written under.
    pub numbers: Policy,
    /// Last update, in microseconds on the wall clock.
    pub updated_at: i64,
}

/// Every bucket of the memory store in this database; empty when not preloaded.
pub fn list() -> Vec<Listed> {
    let mut rows = Vec::new();
    for_each_slot("rate_limit.buckets", |s, now, wall_offset| {
        if let Some(numbers) = slot_policy(s) {
            let state = s.state.load();
            rows.push(Listed {
                kind: kind_from_byte(s.used),
                policy_tag: s.policy_tag,
                key: shown_key(s),
                millionths: numbers.tokens_millionths(state, now),
                numbers,
                updated_at: state.at.saturating_add(wall_offset),
            });
        }
    });
    rows
}

/// Size and use of the memory store, and of the current database's share of it.
pub struct Usage {
    /// `rate_limit.max_buckets` at server start.
    pub max_buckets: i64,
    /// Buckets stored now, of every database.
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
    /// `rate_limit.database_share` of the current database, in percent.
    pub share_percent: i64,
    /// The most buckets the current database may hold (its cap in every partition).
    pub share_buckets: i64,
    /// Buckets the current database holds now.
    pub database_buckets: i64,
    /// `rate_limit.role_share` of the session's login role, in percent (100 for a superuser).
    pub role_share_percent: i64,
    /// The most buckets that lets the role hold, over every database (its cap in every partition).
    pub role_share_buckets: i64,
    /// Buckets the session's login role holds now, over every database.
    pub role_buckets: i64,
}

/// Reports the memory store's size and use.
pub fn usage(function: &'static str) -> Result<Usage, ErrorReport> {
    let table = Table::attach(function)?;
    let h = table.header;
    let (database, role) = (current_database(), current_role());
    let (mut buckets, mut mine, mut roles) = (0i64, 0i64, 0i64);
    for p in 0..h.partitions {
        let part = table.lock_shared(p);
        buckets += i64::from(part.header.count);
        mine += i64::from(part.owners.database(database));
        roles += i64::from(part.owners.role(role));
    }
    let share = gucs::database_share();
    let role_share = if role_is_superuser() {
        100
    } else {
        gucs::role_share()
    };
    let total = table.segment_bytes() as i64;
    Ok(Usage {
        max_buckets: i64::from(h.max_buckets),
        buckets,
        partitions: i64::from(h.partitions),
        slots: i64::from(h.partitions) * i64::from(h.slots_per_partition),
        slot_bytes: SLOT_BYTES as i64,
        total_bytes: total,
        bytes_per_bucket: total / i64::from(h.max_buckets.max(1)),
        lossless_evictions: h
            .evictions
            .lossless
            .load(std::sync::atomic::Ordering::Relaxed) as i64,
        lossy_evictions: h.evictions.lossy.load(std::sync::atomic::Ordering::Relaxed) as i64,
        refused_full: h.refused_full.load(std::sync::atomic::Ordering::Relaxed) as i64,
        share_percent: i64::from(share),
        share_buckets: i64::from(shares::cap(h.limit_per_partition, share))
            * i64::from(h.partitions),
        database_buckets: mine,
        role_share_percent: i64::from(role_share),
        role_share_buckets: i64::from(shares::cap(h.limit_per_partition, role_share))
            * i64::from(h.partitions),
        role_buckets: roles,
    })
}

/// The buckets each database holds in the memory store: (database OID, buckets), every database that
/// holds any, in OID order.
pub fn shares(function: &'static str) -> Result<Vec<(u32, i64)>, ErrorReport> {
    let table = Table::attach(function)?;
    let mut per_database: std::collections::BTreeMap<u32, i64> = Default::default();
    for p in 0..table.header.partitions {
        // copied under the lock into room allocated before it, added up after it is released
        let mut counts = Vec::with_capacity(shares::table_len(table.header.limit_per_partition));
        {
            let part = table.lock_shared(p);
            counts.extend(shares::each(part.owners.databases));
        }
        for (database, count) in counts {
            *per_database.entry(database).or_default() += i64::from(count);
        }
    }
    Ok(per_database.into_iter().collect())
}
