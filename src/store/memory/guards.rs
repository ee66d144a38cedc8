//! The partition locks as types: a [`SharedGuard`] can only read a partition (its slots' state words, the
//! one field that changes behind it, are atomics), an [`ExclusiveGuard`] can write it. [`Locked`] holds
//! the exclusive locks of one call on several partitions, taken lowest first (the global lock order, so
//! two calls cannot deadlock). Each guard releases its lock exactly once, when it drops.

use pgrx::pg_sys;

use super::segment::{PartitionPointers, Table};
use super::slots::{probe, Partition, PartitionHeader, Probe, Slot};
use rate_limit_model::shares::{Count, Owners};
use rate_limit_model::target::MAX_TARGETS;

/// The partitions' locks, taken through the guards that make reading and writing under them safe.
impl Table {
    /// Locks partition `p` (taken modulo the partition count) SHARED: read access until the guard drops.
    pub fn lock_shared(&self, p: u32) -> SharedGuard<'_> {
        let p = p % self.header.partitions;
        // SAFETY: p < partitions; the guard takes the lock before it borrows the header and slots.
        unsafe { SharedGuard::acquire(self.partition(p)) }
    }

    /// Locks partition `p` (taken modulo the partition count) EXCLUSIVE: write access until the guard drops.
    pub fn lock_exclusive(&self, p: u32) -> ExclusiveGuard<'_> {
        let p = p % self.header.partitions;
        // SAFETY: p < partitions; the guard takes the lock before it borrows the header and slots.
        unsafe { ExclusiveGuard::acquire(self.partition(p), self.header.limit_per_partition) }
    }
}

/// A partition locked SHARED: it can only be read.
pub(super) struct SharedGuard<'a> {
    lock: *mut pg_sys::LWLock,
    pub header: &'a PartitionHeader,
    pub owners: Owners<&'a [Count]>,
    pub slots: &'a [Slot],
}

impl<'a> SharedGuard<'a> {
    /// Takes the partition's lock SHARED, then borrows its header, owner counts and slots for reading.
    ///
    /// # Safety
    /// `p` points at one partition of the segment ([`Table`]'s layout), which outlives `'a`.
    pub unsafe fn acquire(p: PartitionPointers) -> SharedGuard<'a> {
        // SAFETY: the lock is taken before the borrows, and only shared borrows are made: writers need the
        // exclusive lock, which cannot be held meanwhile (the caller's contract gives valid pointers, and
        // the owners' region holds two tables of `owner_table_len` counts).
        unsafe {
            pg_sys::LWLockAcquire(p.lock, pg_sys::LWLockMode::LW_SHARED);
            let (databases, roles) = p.owner_tables();
            SharedGuard {
                lock: p.lock,
                header: &*p.header,
                owners: Owners {
                    databases: &*databases,
                    roles: &*roles,
                },
                slots: std::slice::from_raw_parts(p.slots, p.slots_len as usize),
            }
        }
    }

    /// Finds `hash`, or the empty slot that ends its probe chain.
    pub fn probe(&self, hash: &[u64; 2]) -> Probe {
        probe(self.slots, hash)
    }
}

/// A partition locked EXCLUSIVE: it can be read and written.
pub(super) struct ExclusiveGuard<'a> {
    lock: *mut pg_sys::LWLock,
    partition: Partition<'a>,
}

impl<'a> ExclusiveGuard<'a> {
    /// Takes the partition's lock EXCLUSIVE, then borrows its header, owner counts and slots for writing;
    /// `limit` is the buckets it may hold.
    ///
    /// # Safety
    /// As for [`SharedGuard::acquire`].
    pub unsafe fn acquire(p: PartitionPointers, limit: u32) -> ExclusiveGuard<'a> {
        // SAFETY: the exclusive lock is taken before the mutable borrows, so no other process reads or
        // writes the partition while the guard lives (the caller's contract gives valid pointers; the two
        // owner tables and the slots do not overlap).
        unsafe {
            pg_sys::LWLockAcquire(p.lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let (databases, roles) = p.owner_tables();
            ExclusiveGuard {
                lock: p.lock,
                partition: Partition {
                    header: &mut *p.header,
                    owners: Owners {
                        databases: &mut *databases,
                        roles: &mut *roles,
                    },
                    slots: std::slice::from_raw_parts_mut(p.slots, p.slots_len as usize),
                    limit,
                },
            }
        }
    }
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
        // SAFETY: the lock was acquired in SharedGuard::acquire by this guard and is released exactly once.
        unsafe { pg_sys::LWLockRelease(self.lock) }
    }
}

impl Drop for ExclusiveGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the lock was acquired in ExclusiveGuard::acquire by this guard and is released once.
        unsafe { pg_sys::LWLockRelease(self.lock) }
    }
}

/// Locked partitions of one call, in ascending partition order (the global lock order: two calls that
/// lock several partitions cannot deadlock).
pub(super) struct Locked<'a> {
    partitions: [u32; MAX_TARGETS],
    guards: Vec<ExclusiveGuard<'a>>,
}

impl<'a> Locked<'a> {
    /// Locks the distinct partitions of `parts` exclusively, lowest first. Allocates before locking.
    pub fn lock(table: &'a Table, parts: &[u32]) -> Locked<'a> {
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

    /// The guard of `partition` (one of those locked).
    pub fn guard(&mut self, partition: u32) -> &mut ExclusiveGuard<'a> {
        let i = self.partitions[..self.guards.len()]
            .iter()
            .position(|&p| p == partition)
            .unwrap_or(0);
        &mut self.guards[i]
    }
}
