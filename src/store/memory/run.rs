//! A run of takes over many keys of one policy (`take_batch`), each key alone: the lock-free take of
//! [`cas`](super::cas) for keys whose bucket exists. Every key's keyed hash is computed first (the
//! namespace's part of it once), and the keys are then decided in the order of their buckets in memory
//! ([`Run::key`]): a batch of random keys walks the segment from one end to the other, so the
//! page-table entries and cache lines one key's lookup loads serve the keys after it, instead of every key
//! being a TLB miss of its own (with 4 kB pages a 1 000 000-bucket store spans 32 000 of them). A key
//! named twice has one bucket, so its takes keep the order they were given in; keys of different buckets
//! are independent, and the caller returns every outcome in the order given. Each bucket is loaded into
//! the CPU cache [`AHEAD`] keys before its take. The clock is read every [`CLOCK_EVERY`] keys: a key is
//! decided at an instant at most that many keys old, which can only find fewer tokens refilled, never more.

use pgrx::pg_sys::panic::ErrorReport;

use std::cell::Cell;

use super::super::interrupts;
use super::atomic_state::AtomicState;
use super::cas::take_under;
use super::hand_blocks::Bit;
use super::segment::{key_hash, Table};
use crate::backend::current_database;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::pipeline::batch::{Each, Key, Visit};
use rate_limit_model::target::{Ask, Namespace, Target};

/// How many keys ahead of its take a key's bucket is loaded: enough for a miss (a few hundred nanoseconds)
/// to complete while the keys before it are decided.
pub const AHEAD: usize = 8;

/// The most keys a run takes under one lock of their partition ([`Run::take_group`]).
const GROUP: usize = 64;

/// Where and why [`Run::take_group`] stopped: each names the number of the first key it did not decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The short path could not grant this key: it goes through the store's full take.
    NotGranted(usize),
    /// The group ended before this key (another partition, the group's size, or the end of the run).
    Ended(usize),
}

/// How many keys of a run are decided on one reading of the clock.
const CLOCK_EVERY: usize = 32;

/// A key of a batch, where it is decided in the run's order, with what its take needs: the run reads
/// them in its own order, and a read at random from an array of the batch's size costs a TLB miss of its
/// own.
#[derive(Clone, Copy)]
struct Place<'k> {
    /// The key's index in the batch.
    index: usize,
    /// The key's keyed hash.
    hash: [u64; 2],
    key: &'k str,
    cost: i64,
}

/// The keys of a batch, hashed and put in the order of their buckets, and the store's clock.
pub struct Run<'k> {
    table: Table,
    /// The keys in the order they are decided in: by the region of the segment their bucket's probe chain
    /// starts in, and in the order given within a region.
    order: Vec<Place<'k>>,
    lock_free: bool,
    /// The store's clock when the run's key number `n - n % CLOCK_EVERY` was taken.
    now: Cell<i64>,
}

impl<'k> Run<'k> {
    /// A run over `keys`, all of `namespace`, taking `costs[i]` tokens from `keys[i]`, in the store (an
    /// error when it is not available).
    pub fn plan(
        function: &'static str,
        namespace: &Namespace<'_>,
        keys: &[&'k str],
        costs: &[i64],
    ) -> Result<Run<'k>, ErrorReport> {
        let table = Table::attach(function)?;
        let hasher = table.namespace_hasher(namespace);
        let places: Vec<Place<'k>> = keys
            .iter()
            .zip(costs)
            .enumerate()
            .map(|(index, (&key, &cost))| Place {
                index,
                hash: key_hash(hasher, key),
                key,
                cost,
            })
            .collect();
        let order = by_region(&table, places);
        for place in order.iter().take(AHEAD) {
            table.prefetch(&place.hash);
        }
        Ok(Run {
            table,
            order,
            lock_free: AtomicState::swaps_are_lock_free(),
            now: Cell::new(0),
        })
    }

    /// How many keys the run decides.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// The key decided `n`th: its index in the batch, the key and its cost.
    pub fn key(&self, n: usize) -> (usize, &'k str, i64) {
        let place = &self.order[n];
        (place.index, place.key, place.cost)
    }

    /// Starts loading the bucket of the key decided `n`th into the CPU cache; its take should come
    /// [`AHEAD`] keys later (the first [`AHEAD`] are loaded by [`Run::plan`]).
    fn load(&self, n: usize) {
        self.table.prefetch(&self.order[n].hash);
    }

    /// Takes the keys decided from the `from`th on (before `end`) with the short path, under one SHARED
    /// lock of their partition: each key's `cost` tokens (above 0) from its existing bucket with one
    /// compare-and-swap, `template` giving everything but the key, `granted(n, outcome)` told of each.
    /// Stops before the first key it cannot grant that way (its bucket does not exist, was written under
    /// other numbers, or is short; its cost is 0; swaps are not lock-free on this CPU: nothing was written
    /// for it, and it goes through the store's full take), before the first key of another partition, and
    /// after [`GROUP`] keys, so that the lock is held for a few microseconds at most (interrupts wait
    /// while it is held). Returns where it stopped and why, or the first error of `granted`.
    ///
    /// `granted` runs under the lock, each key as soon as it is taken (work done between the swaps, not
    /// after the group: a group's writes at random places of a large batch, made in a row, would stall
    /// the CPU on its full store buffer); it must not raise a PostgreSQL error.
    pub fn take_group<E>(
        &self,
        from: usize,
        end: usize,
        template: &Target<'_>,
        mut granted: impl FnMut(usize, Outcome) -> Result<(), E>,
    ) -> Result<Stop, E> {
        if !self.lock_free || from >= end {
            return Ok(Stop::NotGranted(from));
        }
        let partition = self.table.partition_of(&self.order[from].hash);
        let part = self.table.lock_shared(partition);
        let end = end.min(from + GROUP);
        for n in from..end {
            let place = &self.order[n];
            if n > from && self.table.partition_of(&place.hash) != partition {
                return Ok(Stop::Ended(n));
            }
            if n + AHEAD < self.order.len() {
                self.load(n + AHEAD);
            }
            if place.cost <= 0 {
                return Ok(Stop::NotGranted(n));
            }
            if n.is_multiple_of(CLOCK_EVERY) || self.now.get() == 0 {
                self.now.set(self.table.now());
            }
            let target = Target {
                key: place.key,
                ..*template
            };
            match take_under(&part, &target, &place.hash, Ask::Take(place.cost), || {
                self.now.get()
            })
            .filter(|o| o.allowed)
            {
                Some(o) => granted(n, o)?,
                None => return Ok(Stop::NotGranted(n)),
            }
        }
        Ok(Stop::Ended(end))
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

/// The most keys the memory store puts in one order ([`Run`]): enough for a run's neighbouring
/// keys to share pages of the store, few enough to keep a run's memory small (its keys' places, about 50
/// bytes each).
const RUN_KEYS: usize = 65_536;

/// The memory store's way through a batch (the seam's `Buckets::take_each`): runs of at most
/// [`RUN_KEYS`] keys; within one, a group of keys of one partition under one lock at a time, each granted
/// by the lock-free swap when `bulk` allows it and no block by hand may exist (read per group: one may be
/// made meanwhile), every other key left to the model after `ensure_here(key)` (the Citus guard).
pub fn each_of_batch(
    function: &'static str,
    template: &Target<'_>,
    keys: &[&str],
    costs: &[i64],
    bulk: bool,
    ensure_here: impl Fn(&str) -> Result<(), ErrorReport>,
    each: &mut impl Visit<ErrorReport>,
) -> Result<(), ErrorReport> {
    let swaps = bulk && !crate::cluster::citus::citus_installed();
    /// The key decided `n`th in `run`, a run of the batch's keys from `start` on.
    fn key_of<'k>(run: &Run<'k>, start: usize, n: usize) -> Key<'k> {
        let (i, key, cost) = run.key(n);
        Key {
            index: start + i,
            key,
            cost,
        }
    }
    for start in (0..keys.len()).step_by(RUN_KEYS) {
        let end = keys.len().min(start + RUN_KEYS);
        let run = Run::plan(
            function,
            &template.namespace,
            &keys[start..end],
            &costs[start..end],
        )?;
        let hand_block_bit = run.hand_block_bit(&template.namespace);
        let mut n = 0;
        while n < run.len() {
            interrupts::check_every(n);
            // interrupts are checked between groups (a group holds a partition's lock)
            let group_end = run.len().min(interrupts::next_check_after(n));
            let stop = if swaps && !run.blocks_by_hand(hand_block_bit) {
                // what `each` does with a key decided in bulk raises no PostgreSQL error (the seam's
                // memo, statistics and outcome)
                run.take_group(n, group_end, template, |m, o| {
                    each.visit(key_of(&run, start, m), Each::Decided(o))
                })?
            } else {
                Stop::NotGranted(n)
            };
            n = match stop {
                Stop::Ended(next) => next,
                Stop::NotGranted(m) => {
                    let k = key_of(&run, start, m);
                    ensure_here(k.key)?;
                    each.visit(k, Each::Alone)?;
                    m + 1
                }
            };
        }
    }
    Ok(())
}

/// `places` in the order of the regions of the segment where their buckets' probe chains start, as many
/// regions as places (so a region is about the memory between two keys' buckets), and within a region in
/// the order given. Two places of one key have one bucket, so they keep their order.
fn by_region<'k>(table: &Table, places: Vec<Place<'k>>) -> Vec<Place<'k>> {
    let regions = places.len().max(1);
    // regions per slot, as a float: a home slot number times it is the slot's region (rounding can only
    // move a slot to a neighbouring region, which changes the order, never a decision)
    let scale = regions as f64 / table.slot_count().max(1) as f64;
    stable_by_region(places, regions, |p| {
        ((table.home_slot_number(&p.hash) as f64 * scale) as usize).min(regions - 1)
    })
}

/// `items` ordered by `region_of` (below `regions`), in the order given within a region: a counting sort,
/// two passes over the items.
fn stable_by_region<T: Copy>(
    items: Vec<T>,
    regions: usize,
    region_of: impl Fn(&T) -> usize,
) -> Vec<T> {
    let Some(&first) = items.first() else {
        return items;
    };
    let region: Vec<usize> = items.iter().map(region_of).collect();
    // starts[r + 1]: the items of region r, then where region r starts
    let mut starts = vec![0usize; regions + 1];
    for &r in &region {
        starts[r + 1] += 1;
    }
    for r in 1..=regions {
        starts[r] += starts[r - 1];
    }
    let mut order = vec![first; items.len()];
    for (item, r) in items.into_iter().zip(region) {
        order[starts[r]] = item;
        starts[r] += 1;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::stable_by_region;
    use proptest::prelude::*;

    proptest! {
        /// The order is a permutation of the items, by region, and the order given within a region.
        #[test]
        fn items_come_by_region_and_in_their_order_within_one(
            regions_of in proptest::collection::vec(0usize..50, 0..400),
        ) {
            let items: Vec<(usize, usize)> = regions_of.iter().copied().enumerate().collect();
            let ordered = stable_by_region(items.clone(), 50, |&(_, r)| r);
            let mut expected = items;
            expected.sort_by_key(|&(i, r)| (r, i));
            prop_assert_eq!(ordered, expected);
        }
    }
}
