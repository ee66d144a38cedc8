//! The one primitive each store implements, [`Buckets`], that the seam's view of a store for the model's
//! pipeline (`Seam` in the seam's `mod.rs`) wraps, so that the model's flows (take, charge, refund,
//! acquire, release: `rate_limit_model::pipeline`) and the seam's own (blocks by hand, reset) are written
//! over it once: [`TableBuckets`] over `table`'s statements, [`MemoryBuckets`] over `memory`'s partitions.
//! Besides the model's store, it has what stays with the adapters: the Citus guard
//! ([`Buckets::ensure_here`]), the note of a block by hand, the read-only rule of counting a denial
//! ([`Buckets::prepare_count`]), and reset. [`with_store!`] is the seam's `match` on the
//! store for every flow: a flow is a generic function called through it (a batch too: each store's way
//! through one, [`Buckets::take_each`], is in its own module).
//!
//! Under Citus a memory bucket lives only on the node of its key's shard: every primitive of
//! [`MemoryBuckets`] checks that first ([`Buckets::ensure_here`]), once per key and flow.

use std::cell::RefCell;

use pgrx::pg_sys::panic::ErrorReport;

use super::{memory, table};
use crate::cluster;
use crate::gucs::Store;
use crate::time::clock;
use rate_limit_model::algorithm::{Outcome, State};
use rate_limit_model::pipeline::batch::Visit;
use rate_limit_model::pipeline::PerTarget;
use rate_limit_model::target::{Ask, Namespace, Stored, Target};

/// What a store does to buckets. Every method answers from the store itself; what a backend remembers
/// (short buckets) and the order of blocks and penalty boxes are the flows' (`store/mod.rs`, `blocks`).
pub(super) trait Buckets {
    /// Which store this is.
    const STORE: Store;

    /// 0A000 unless the buckets of `targets` may be answered on this node (the memory store under Citus:
    /// only on the node of each key's shard). Every primitive checks it itself; a flow calls it first when
    /// it may answer before any primitive does.
    fn ensure_here(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
    ) -> Result<(), ErrorReport>;

    /// Now on this store's clock.
    fn now(&self, function: &'static str) -> Result<i64, ErrorReport>;

    /// Takes `costs[i]` tokens from `targets[i]`, every target, all or nothing (every cost 0 only reports):
    /// one outcome each.
    fn take(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
        costs: &[i64],
    ) -> Result<PerTarget<Outcome>, ErrorReport>;

    /// Visits every key of a batch in this store's order ([`rate_limit_model::pipeline::Store::take_each`]),
    /// deciding in bulk what `bulk` allows and this store can, leaving every other key to `each`.
    fn take_each(
        &self,
        function: &'static str,
        template: &Target<'_>,
        keys: &[&str],
        costs: &[i64],
        bulk: bool,
        each: &mut impl Visit<ErrorReport>,
    ) -> Result<(), ErrorReport>;

    /// Reports every target as it is now, writing nothing; in the table store in a fresh snapshot, so that a
    /// change committed since the caller's transaction began is seen.
    fn peek_fresh(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
    ) -> Result<Vec<Outcome>, ErrorReport>;

    /// Answers `ask` (a charge, a denial counted, a block) in the bucket of `target`, creating it when
    /// missing; the bucket afterwards.
    fn write(
        &self,
        function: &'static str,
        target: &Target<'_>,
        ask: Ask,
    ) -> Result<Outcome, ErrorReport>;

    /// Creates the fresh buckets `held` (one call's reservations), `held[i]` holding `amounts[i]` tokens,
    /// in one pass when the store has one: whether every one was recorded
    /// ([`rate_limit_model::pipeline::Store::record`]), or `None` for a store that writes them one by one
    /// (the model's [`rate_limit_model::pipeline::record_each`] then does).
    fn record_in_one_pass(
        &self,
        _function: &'static str,
        _held: &[Target<'_>],
        _amounts: &[i64],
    ) -> Result<Option<bool>, ErrorReport> {
        Ok(None)
    }

    /// Locks and reads the bucket of `target`, asks `step` what to write given it and the clock, and writes
    /// that state over the bucket if it exists (a missing bucket is full: nothing is inserted). `step` must
    /// be pure arithmetic: the memory store runs it under a partition's lock.
    fn update<R>(
        &self,
        function: &'static str,
        target: &Target<'_>,
        step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
    ) -> Result<R, ErrorReport>;

    /// Acquires a lease in the first free slot of `slots` (one key's, in order) with id
    /// `lease_id(random, slot)`: every slot's state as seen, the granted slot's state, and the instant.
    fn acquire(
        &self,
        function: &'static str,
        slots: &[Target<'_>],
        random: u64,
    ) -> Result<(Vec<State>, Option<State>, i64), ErrorReport>;

    /// Deletes a bucket (it is full again); true if it existed.
    fn reset(
        &self,
        function: &'static str,
        namespace: &Namespace<'_>,
        key: &str,
    ) -> Result<bool, ErrorReport>;

    /// Whether a call on `target` must read its key's block bucket whatever its policy says
    /// ([`rate_limit_model::target::Blocking::may_be_blocked`]): blocks by hand this store cannot note in the policy.
    fn reads_block_anyway(
        &self,
        function: &'static str,
        target: &Target<'_>,
    ) -> Result<bool, ErrorReport>;

    /// Notes that the key of `target` (a named policy's) was blocked by hand, so that every call on the
    /// policy reads its key's block from now on.
    fn note_block_by_hand(
        &self,
        function: &'static str,
        target: &Target<'_>,
    ) -> Result<(), ErrorReport>;

    /// Prepares counting a denial of `target` in its block bucket: false when it cannot be counted (a
    /// read-only transaction of the table store, which cannot write); in the table store, locks the row of
    /// the bucket first (the seam's lock order: a key's bucket before its block bucket).
    fn prepare_count(
        &self,
        function: &'static str,
        target: &Target<'_>,
    ) -> Result<bool, ErrorReport>;
}

/// Runs `$body` with `$s` bound to the [`Buckets`] of store `$store`: the seam's one `match` on the store.
macro_rules! with_store {
    ($store:expr, $s:ident => $body:expr) => {
        match $store {
            $crate::gucs::Store::Table => {
                let $s = &$crate::store::buckets::TableBuckets;
                $body
            }
            $crate::gucs::Store::Memory => {
                let $s = &$crate::store::buckets::MemoryBuckets::default();
                $body
            }
        }
    };
}
pub(super) use with_store;

/// The table store's buckets: rows of `rate_limit.bucket_state`, written in the caller's transaction.
pub(super) struct TableBuckets;

impl Buckets for TableBuckets {
    const STORE: Store = Store::Table;

    fn ensure_here(&self, _: &'static str, _: &[Target<'_>]) -> Result<(), ErrorReport> {
        // Citus routes every statement on the distributed table to its shard
        Ok(())
    }

    fn now(&self, _: &'static str) -> Result<i64, ErrorReport> {
        Ok(clock::table_now_us())
    }

    fn take(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
        costs: &[i64],
    ) -> Result<PerTarget<Outcome>, ErrorReport> {
        table::take(function, targets, costs).map(PerTarget::from_vec)
    }

    fn take_each(
        &self,
        function: &'static str,
        template: &Target<'_>,
        keys: &[&str],
        costs: &[i64],
        bulk: bool,
        each: &mut impl Visit<ErrorReport>,
    ) -> Result<(), ErrorReport> {
        table::each_of_batch(function, template, keys, costs, bulk, each)
    }

    fn peek_fresh(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
    ) -> Result<Vec<Outcome>, ErrorReport> {
        table::peek_fresh(function, targets)
    }

    fn write(
        &self,
        function: &'static str,
        target: &Target<'_>,
        ask: Ask,
    ) -> Result<Outcome, ErrorReport> {
        table::upsert(function, target, |stored, now| {
            target.answer(stored, now, ask)
        })
    }

    fn update<R>(
        &self,
        function: &'static str,
        target: &Target<'_>,
        step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
    ) -> Result<R, ErrorReport> {
        table::update(function, target, step)
    }

    fn acquire(
        &self,
        function: &'static str,
        slots: &[Target<'_>],
        random: u64,
    ) -> Result<(Vec<State>, Option<State>, i64), ErrorReport> {
        table::acquire(function, slots, random)
    }

    fn reset(
        &self,
        function: &'static str,
        namespace: &Namespace<'_>,
        key: &str,
    ) -> Result<bool, ErrorReport> {
        table::reset(function, namespace, key)
    }

    fn reads_block_anyway(&self, _: &'static str, _: &Target<'_>) -> Result<bool, ErrorReport> {
        // a block by hand is delegated to its key's node, which cannot write the policies (a reference
        // table) there: under Citus every call reads its key's block
        Ok(cluster::citus::citus_installed())
    }

    fn note_block_by_hand(&self, _: &'static str, _: &Target<'_>) -> Result<(), ErrorReport> {
        // the table store's note is the policy's row, which the policies module writes (the caller of
        // `store::block`): a store never writes the policies
        Ok(())
    }

    fn prepare_count(
        &self,
        function: &'static str,
        target: &Target<'_>,
    ) -> Result<bool, ErrorReport> {
        if table::read_only() {
            return Ok(false);
        }
        table::lock_row(function, target)?;
        Ok(true)
    }
}

/// The memory store's buckets, for one flow: remembers the keys it found to belong on this node.
#[derive(Default)]
pub(super) struct MemoryBuckets {
    /// The keys [`Buckets::ensure_here`] passed in this flow (a flow names one key, or a few).
    here: RefCell<Vec<String>>,
}

impl MemoryBuckets {
    /// The memory store's buckets for a flow on `key` that an earlier flow of this transaction found to
    /// belong on this node (a settle applied at commit, when no catalog may be read): not checked again.
    pub(super) fn checked(key: &str) -> MemoryBuckets {
        MemoryBuckets {
            here: RefCell::new(vec![key.to_string()]),
        }
    }

    /// Answers `ask` for one bucket.
    fn answer_one(
        &self,
        function: &'static str,
        target: &Target<'_>,
        ask: Ask,
    ) -> Result<Outcome, ErrorReport> {
        let one = std::slice::from_ref(target);
        self.ensure_here(function, one)?;
        memory::take(function, one, &[ask])?
            .first()
            .copied()
            .ok_or_else(|| crate::error::bug(function, "the store returned no outcome"))
    }

    /// [`Buckets::ensure_here`] for one key.
    fn ensure_key_here(&self, function: &'static str, key: &str) -> Result<(), ErrorReport> {
        if self.here.borrow().iter().any(|k| k == key) {
            return Ok(());
        }
        // without Citus every key is here: no lookup, no memo (nothing allocated on a call's path)
        if !cluster::citus::citus_installed() {
            return Ok(());
        }
        cluster::citus::ensure_memory_bucket_here(function, key)?;
        self.here.borrow_mut().push(key.to_string());
        Ok(())
    }
}

impl Buckets for MemoryBuckets {
    const STORE: Store = Store::Memory;

    fn ensure_here(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
    ) -> Result<(), ErrorReport> {
        for t in targets {
            self.ensure_key_here(function, t.key)?;
        }
        Ok(())
    }

    fn now(&self, function: &'static str) -> Result<i64, ErrorReport> {
        memory::now(function)
    }

    fn take(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
        costs: &[i64],
    ) -> Result<PerTarget<Outcome>, ErrorReport> {
        self.ensure_here(function, targets)?;
        let asks: PerTarget<Ask> = costs.iter().map(|c| Ask::Take(*c)).collect();
        memory::take(function, targets, &asks)
    }

    fn take_each(
        &self,
        function: &'static str,
        template: &Target<'_>,
        keys: &[&str],
        costs: &[i64],
        bulk: bool,
        each: &mut impl Visit<ErrorReport>,
    ) -> Result<(), ErrorReport> {
        // the memo of keys found here is for a flow of a few keys: each key of a batch is a flow of its own
        let ensure_here = |key: &str| {
            self.here.borrow_mut().clear();
            self.ensure_key_here(function, key)
        };
        memory::each_of_batch(function, template, keys, costs, bulk, ensure_here, each)
    }

    fn peek_fresh(
        &self,
        function: &'static str,
        targets: &[Target<'_>],
    ) -> Result<Vec<Outcome>, ErrorReport> {
        let reports: PerTarget<i64> = targets.iter().map(|_| 0).collect();
        self.take(function, targets, &reports)
            .map(PerTarget::into_vec)
    }

    fn write(
        &self,
        function: &'static str,
        target: &Target<'_>,
        ask: Ask,
    ) -> Result<Outcome, ErrorReport> {
        self.answer_one(function, target, ask)
    }

    /// Every bucket under one pass of exclusive locks (the multi-bucket take, all or nothing), not one
    /// lock per bucket.
    fn record_in_one_pass(
        &self,
        function: &'static str,
        held: &[Target<'_>],
        amounts: &[i64],
    ) -> Result<Option<bool>, ErrorReport> {
        self.ensure_here(function, held)?;
        let asks: PerTarget<Ask> = amounts.iter().map(|a| Ask::Take(*a)).collect();
        let outcomes = memory::take(function, held, &asks)?;
        Ok(Some(outcomes.iter().all(|o| o.allowed)))
    }

    fn update<R>(
        &self,
        function: &'static str,
        target: &Target<'_>,
        step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
    ) -> Result<R, ErrorReport> {
        self.ensure_key_here(function, target.key)?;
        memory::update(function, target, step)
    }

    fn acquire(
        &self,
        function: &'static str,
        slots: &[Target<'_>],
        random: u64,
    ) -> Result<(Vec<State>, Option<State>, i64), ErrorReport> {
        // one slot swapped at a time: the first free one takes the lease, the others are only reported;
        // every slot's bucket is loaded first, so that their cache misses overlap (each slot's hash is
        // computed again by its take: a few dozen nanoseconds against a miss of a few hundred)
        memory::prefetch(function, slots)?;
        let mut states = Vec::with_capacity(slots.len());
        let mut granted = None;
        for (slot, t) in (0_i64..).zip(slots) {
            let ask = match granted {
                None => Ask::Acquire {
                    lease: rate_limit_model::algorithm::lease_id(random, slot),
                },
                Some(_) => Ask::Take(0),
            };
            let o = self.answer_one(function, t, ask)?;
            if granted.is_none() && o.allowed {
                granted = Some(o.state);
            }
            states.push(o.state);
        }
        Ok((states, granted, memory::now(function)?))
    }

    fn reset(
        &self,
        function: &'static str,
        namespace: &Namespace<'_>,
        key: &str,
    ) -> Result<bool, ErrorReport> {
        self.ensure_key_here(function, key)?;
        memory::reset(function, namespace, key)
    }

    fn reads_block_anyway(
        &self,
        function: &'static str,
        target: &Target<'_>,
    ) -> Result<bool, ErrorReport> {
        memory::blocks_by_hand(function, &target.namespace)
    }

    fn note_block_by_hand(
        &self,
        function: &'static str,
        target: &Target<'_>,
    ) -> Result<(), ErrorReport> {
        // at once, as the block itself, whatever the caller's transaction does next: a note in the
        // policy's row would be undone by a ROLLBACK that leaves the block in place
        memory::note_block_by_hand(function, &target.namespace)
    }

    fn prepare_count(&self, _: &'static str, _: &Target<'_>) -> Result<bool, ErrorReport> {
        // counted at once, whatever the caller does next
        Ok(true)
    }
}
