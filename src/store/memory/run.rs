//! A run of takes over many keys of one policy (`take_batch`), each key alone: the lock-free take of
//! [`cas`](super::cas) for keys whose bucket exists, with each key's bucket loaded into the CPU cache
//! [`AHEAD`] keys before its take, and its keyed hash computed once for both (the namespace's part of it
//! once for the run). The clock is read every [`CLOCK_EVERY`] keys: a key is decided at an instant at
//! most that many keys old, which can only find fewer tokens refilled, never more.

use pgrx::pg_sys::panic::ErrorReport;

use std::cell::Cell;

use siphasher::sip128::SipHasher13;

use super::cas::{take_shared_at, AtomicState};
use super::hand_blocks::Bit;
use super::segment::{current_database, key_hash, Table};
use crate::algorithm::Outcome;
use crate::target::{Ask, Namespace, Target};

/// How many keys ahead of its take a key's bucket is loaded: enough for a miss (a few hundred nanoseconds)
/// to complete while the keys before it are decided.
pub const AHEAD: usize = 8;

/// How many keys of a run are decided on one reading of the clock.
const CLOCK_EVERY: usize = 32;

/// The keyed hashes of the next [`AHEAD`] keys of a run, whose buckets are being loaded.
pub struct Run {
    table: Table,
    hashes: [[u64; 2]; AHEAD],
    lock_free: bool,
    /// The hasher of the run's namespace (that of its first key), before any key.
    namespace: Option<SipHasher13>,
    /// The store's clock when key number `n - n % CLOCK_EVERY` was taken.
    now: Cell<i64>,
}

impl Run {
    /// A run over the store (an error when it is not available).
    pub fn attach(function: &'static str) -> Result<Run, ErrorReport> {
        Ok(Run {
            table: Table::attach(function)?,
            hashes: [[0; 2]; AHEAD],
            lock_free: AtomicState::swaps_are_lock_free(),
            namespace: None,
            now: Cell::new(0),
        })
    }

    /// Starts loading the bucket of `target`, the run's key number `n`, into the CPU cache; its take
    /// comes [`AHEAD`] keys later and must name the same number.
    /// Every key of a run must be of one namespace.
    pub fn load(&mut self, n: usize, target: &Target<'_>) {
        let table = &self.table;
        let namespace = self
            .namespace
            .get_or_insert_with(|| table.namespace_hasher(&target.namespace));
        let hash = key_hash(*namespace, target.key);
        self.table.prefetch(&hash);
        self.hashes[n % AHEAD] = hash;
    }

    /// Takes `cost` tokens (above 0) from the existing bucket of `target`, the run's key number `n` (loaded
    /// by [`Run::load`]), under its partition's shared lock with one compare-and-swap: the outcome when
    /// they were granted. `None` when that path cannot grant them (the bucket does not exist, was written
    /// under other numbers, or is short) or swaps are not lock-free on this CPU: nothing was written, and
    /// the key goes through the store's full take.
    pub fn take_granted(&self, n: usize, target: &Target<'_>, cost: i64) -> Option<Outcome> {
        if !self.lock_free {
            return None;
        }
        if n.is_multiple_of(CLOCK_EVERY) || self.now.get() == 0 {
            self.now.set(self.table.now());
        }
        let hash = &self.hashes[n % AHEAD];
        let partition = self.table.partition_of(hash);
        take_shared_at(
            &self.table,
            target,
            hash,
            partition,
            Ask::Take(cost),
            || self.now.get(),
        )
        .filter(|o| o.allowed)
    }

    /// The bit that says whether a key of `namespace` may have been blocked by hand in this store
    /// ([`Run::blocks_by_hand`]).
    pub fn hand_block_bit(&self, namespace: &Namespace<'_>) -> Bit {
        Bit::of(current_database(), namespace)
    }

    /// Whether a key of the namespace of `bit` may have been blocked by hand in this store, now: then every
    /// call of it reads its key's block, and no key takes this run's short path.
    pub fn blocks_by_hand(&self, bit: Bit) -> bool {
        self.table.header.hand_blocks.is_set(bit)
    }
}
