//! Shares: how much of the memory store one database may fill, so that no role in one database can refuse,
//! evict or reset the buckets of another.
//!
//! Each database may hold at most `ceil(limit × rate_limit.database_share / 100)` buckets in any one
//! partition (its *cap*), where `limit` is the partition's capacity. The share is a superuser setting
//! (`PGC_SUSET`), set for the whole server or per database with `ALTER DATABASE … SET`; the cap is applied
//! by the backend that inserts, with its own database's setting. Counting per partition, not per server,
//! makes the bound exact: a partition's counts are kept in its header ([`Owners`]) and change only under
//! its exclusive lock, together with the slots they count, so a share check never races an insert.
//!
//! What follows, per partition, when a new bucket of database `d` does not fit ([`Room::needed`]):
//! - `d`'s cap is reached: a full bucket *of `d`* is evicted (lossless); failing that, with
//!   `rate_limit.on_full = 'evict_oldest'`, the least recently updated bucket *of `d`* (lossy: that key of
//!   `d` starts full again); else 53200. Another database's bucket is never touched.
//! - the partition is full although `d` is under its cap (the shares of the databases in use add up to more
//!   than 100%): a full bucket of any database is evicted (lossless, nothing is reset); else 53200.
//!   Never a bucket that is not full.
//! - the partition's owner table has no entry left for `d` ([`OWNERS`] databases already hold buckets
//!   there): as for a full partition.
//!
//! So while the shares of the databases that use the memory store add up to 100% or less, a database is
//! refused or evicted only because of its own buckets.

/// Databases that can hold buckets in one partition at once.
pub const OWNERS: usize = 16;

/// One database's bucket count in a partition; `count == 0` marks a free entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Owner {
    database: u32,
    count: u32,
}

/// The bucket count of each database that holds buckets in one partition.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Owners {
    entries: [Owner; OWNERS],
}

impl Owners {
    /// Buckets of `database` in the partition.
    pub fn count(&self, database: u32) -> u32 {
        self.entries
            .iter()
            .find(|o| o.count > 0 && o.database == database)
            .map_or(0, |o| o.count)
    }

    /// Whether a bucket of `database` can be counted (it holds buckets here already, or an entry is free).
    pub fn has_room_for(&self, database: u32) -> bool {
        self.entries
            .iter()
            .any(|o| o.count == 0 || o.database == database)
    }

    /// Counts one more bucket of `database`; false if no entry is left (see [`Owners::has_room_for`]).
    pub fn add(&mut self, database: u32) -> bool {
        if let Some(o) = self
            .entries
            .iter_mut()
            .find(|o| o.count > 0 && o.database == database)
        {
            o.count += 1;
            return true;
        }
        match self.entries.iter_mut().find(|o| o.count == 0) {
            Some(o) => {
                *o = Owner { database, count: 1 };
                true
            }
            None => false,
        }
    }

    /// Counts one bucket of `database` less.
    pub fn remove(&mut self, database: u32) {
        if let Some(o) = self
            .entries
            .iter_mut()
            .find(|o| o.count > 0 && o.database == database)
        {
            o.count -= 1;
        }
    }

    /// Each database with buckets here and how many.
    pub fn each(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries
            .iter()
            .filter(|o| o.count > 0)
            .map(|o| (o.database, o.count))
    }
}

/// The most buckets a database whose share is `percent` may hold in a partition of `limit` buckets.
pub fn cap(limit: u32, percent: u32) -> u32 {
    let percent = percent.clamp(1, 100);
    (u64::from(limit) * u64::from(percent)).div_ceil(100).max(1) as u32
}

/// What a partition must free before `missing` new buckets of a database fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// They fit.
    Enough,
    /// The database's cap would be exceeded: evict one of its own buckets.
    FromOwnShare,
    /// The partition (or its owner table) is full: evict a full bucket of any database.
    FullBucketOfAnyone,
}

impl Room {
    /// Decides for `missing` new buckets of `database` in a partition holding `count` buckets of at most
    /// `limit`, whose owners are `owners`, the database's cap being `cap`.
    pub fn needed(
        owners: &Owners,
        count: u32,
        limit: u32,
        database: u32,
        cap: u32,
        missing: u32,
    ) -> Room {
        if missing == 0 {
            Room::Enough
        } else if owners.count(database) + missing > cap {
            Room::FromOwnShare
        } else if count + missing > limit || !owners.has_room_for(database) {
            Room::FullBucketOfAnyone
        } else {
            Room::Enough
        }
    }
}

/// Why a partition could not make room: the 53200 error says which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRoom {
    /// The database's own share is full and none of its buckets could be evicted.
    ShareFull,
    /// The partition is full of other databases' buckets, none of them full.
    StoreFull,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_round_up_and_never_reach_zero() {
        assert_eq!(cap(64, 50), 32);
        assert_eq!(cap(65, 50), 33);
        assert_eq!(cap(64, 100), 64);
        assert_eq!(cap(10, 1), 1);
        assert_eq!(cap(0, 50), 1);
        assert_eq!(cap(u32::MAX, 100), u32::MAX);
        assert_eq!(cap(64, 0), 1, "a share below 1% counts as 1%");
        assert_eq!(cap(64, 200), 64, "a share above 100% counts as 100%");
    }

    #[test]
    fn owners_count_per_database_and_free_entries_at_zero() {
        let mut o = Owners::default();
        assert!(o.add(7) && o.add(7) && o.add(9));
        assert_eq!((o.count(7), o.count(9), o.count(8)), (2, 1, 0));
        o.remove(9);
        assert_eq!(o.count(9), 0);
        assert_eq!(o.each().collect::<Vec<_>>(), vec![(7, 2)]);
        for db in 100..100 + OWNERS as u32 - 1 {
            assert!(o.add(db));
        }
        assert!(!o.has_room_for(5), "every entry is in use");
        assert!(!o.add(5));
        assert!(o.has_room_for(7) && o.add(7), "a database already counted");
        o.remove(100);
        assert!(
            o.has_room_for(5) && o.add(5),
            "an entry freed by its last bucket"
        );
        o.remove(12345); // nothing to remove: no change
        assert_eq!(
            o.each().map(|(_, c)| c).sum::<u32>(),
            3 + OWNERS as u32 - 2 + 1
        );
    }

    #[test]
    fn room_is_taken_from_the_share_that_is_full() {
        let mut o = Owners::default();
        for _ in 0..32 {
            o.add(1);
        }
        // database 1 at its cap of 32 in a 64-bucket partition: its own share must give
        assert_eq!(Room::needed(&o, 32, 64, 1, 32, 1), Room::FromOwnShare);
        // database 2, under its cap, fits
        assert_eq!(Room::needed(&o, 32, 64, 2, 32, 1), Room::Enough);
        // a partition filled by overcommitted shares: only full buckets may go
        assert_eq!(Room::needed(&o, 64, 64, 2, 40, 1), Room::FullBucketOfAnyone);
        assert_eq!(Room::needed(&o, 64, 64, 2, 40, 0), Room::Enough);
    }
}
