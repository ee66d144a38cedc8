//! Shares: how much of the memory store one role and one database may fill, so that no role, from any
//! number of databases, can refuse, evict or reset the buckets of another.
//!
//! Every bucket is counted for its database and for its role (the session's login role, which `SET ROLE`
//! does not change), per partition. In any one partition a role may hold at most
//! `ceil(limit × rate_limit.role_share / 100)` buckets over all databases, and a database at most
//! `ceil(limit × rate_limit.database_share / 100)` (its *caps*), where `limit` is the partition's capacity.
//! Both shares are superuser settings (`PGC_SUSET`, per role or database with `ALTER ROLE`/`ALTER DATABASE
//! … SET`), applied by the backend that inserts; a superuser's session is not held to the role share (it
//! could raise it anyway). Counting per partition, not per server, makes the bound exact: a partition's
//! counts ([`Owners`]) change only under its exclusive lock, together with the slots they count.
//!
//! The counts live in two open-addressing tables per partition, one for databases and one for roles, each
//! with as many entries as the partition holds buckets ([`table_len`]): every counted owner holds at
//! least one bucket there, so a table always has a free entry for the owner of a new bucket, however many
//! databases or roles there are. (A fixed table could be filled by one role connecting to many databases,
//! and every other database's new keys refused.)
//!
//! What follows, per partition, when a new bucket of role `r` in database `d` does not fit
//! ([`Room::needed`]):
//! - `d`'s cap is reached: a full bucket of `d` is evicted (lossless); failing that, with
//!   `rate_limit.on_full = 'evict_oldest'`, the least recently updated bucket of `r` in `d` (lossy: that
//!   key starts full again); else 53200;
//! - `r`'s cap is reached: the same with `r`'s buckets, in any database;
//! - the partition is full although both are under their caps (the shares in use add up to more than
//!   100%): a full bucket of anyone is evicted (lossless, nothing is reset); else 53200.
//!
//! A lossy eviction takes only a bucket the caller's own role made, and never a bucket that is not full
//! otherwise. So a role `a` that floods from any number of databases holds at most its role cap in a
//! partition, and another role `v` is refused only if `v`'s own caps are reached or if the roles other than
//! `a` fill the rest: with the default shares (50%), one flooding role leaves every other role at least
//! half of each partition ([`victim_always_fits`] states it, the property tests check it).

/// One owner's bucket count in a partition; `count == 0` marks a free entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    id: u32,
    count: u32,
}

/// Entries of each count table of a partition that holds at most `limit` buckets: one per bucket, so that
/// the owners of the buckets, at most one each, always leave an entry free for a new one.
pub fn table_len(limit: u32) -> usize {
    limit.max(1) as usize
}

/// Where `id`'s probe starts (a multiplicative hash, so that consecutive OIDs spread out).
fn home(table: &[Count], id: u32) -> usize {
    ((u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % table.len() as u64) as usize
}

/// The entry of `id`, or the free entry that ends its probe, or None if neither was found (a full table).
fn find(table: &[Count], id: u32) -> Option<usize> {
    let n = table.len();
    let start = home(table, id);
    (0..n)
        .map(|i| (start + i) % n)
        .find(|&i| table[i].count == 0 || table[i].id == id)
}

/// Buckets of `id` in `table`.
pub fn count(table: &[Count], id: u32) -> u32 {
    match find(table, id) {
        Some(i) if table[i].count > 0 => table[i].count,
        _ => 0,
    }
}

/// Counts one more bucket of `id`; false if the table has no entry left (never, when it has
/// [`table_len`] entries and holds the owners of fewer buckets than that).
pub fn add(table: &mut [Count], id: u32) -> bool {
    match find(table, id) {
        Some(i) => {
            table[i] = Count {
                id,
                count: table[i].count + 1,
            };
            true
        }
        None => false,
    }
}

/// Counts one bucket of `id` less; an entry that reaches zero is freed by shifting the rest of its
/// probe chain back (no tombstones, so a probe still stops at the first free entry).
pub fn remove(table: &mut [Count], id: u32) {
    let Some(mut hole) = find(table, id).filter(|&i| table[i].count > 0) else {
        return;
    };
    table[hole].count -= 1;
    if table[hole].count > 0 {
        return;
    }
    let n = table.len();
    let mut j = hole;
    loop {
        j = (j + 1) % n;
        if table[j].count == 0 || j == hole {
            return;
        }
        let home = home(table, table[j].id);
        // the entry at j may move to the hole unless its home lies cyclically in (hole, j]
        let stays = if hole <= j {
            hole < home && home <= j
        } else {
            hole < home || home <= j
        };
        if !stays {
            table[hole] = table[j];
            table[j] = Count::default();
            hole = j;
        }
    }
}

/// Each owner with buckets in `table` and how many.
pub fn each(table: &[Count]) -> impl Iterator<Item = (u32, u32)> + '_ {
    table
        .iter()
        .filter(|c| c.count > 0)
        .map(|c| (c.id, c.count))
}

/// The bucket counts of a partition: per database and per role. `T` is a slice of the partition's
/// shared memory (mutable under the exclusive lock), or a vector in the tests.
pub struct Owners<T> {
    /// Buckets per database OID.
    pub databases: T,
    /// Buckets per role OID.
    pub roles: T,
}

impl<T: AsRef<[Count]>> Owners<T> {
    /// Buckets of `database` in the partition.
    pub fn database(&self, database: u32) -> u32 {
        count(self.databases.as_ref(), database)
    }

    /// Buckets of `role` in the partition, over every database.
    pub fn role(&self, role: u32) -> u32 {
        count(self.roles.as_ref(), role)
    }
}

impl<T: AsRef<[Count]> + AsMut<[Count]>> Owners<T> {
    /// Counts a new bucket of `role` in `database`; false (and nothing counted) if a table is full.
    pub fn add(&mut self, database: u32, role: u32) -> bool {
        if find(self.databases.as_ref(), database).is_none()
            || find(self.roles.as_ref(), role).is_none()
        {
            return false;
        }
        add(self.databases.as_mut(), database) && add(self.roles.as_mut(), role)
    }

    /// Counts a bucket of `role` in `database` less.
    pub fn remove(&mut self, database: u32, role: u32) {
        remove(self.databases.as_mut(), database);
        remove(self.roles.as_mut(), role);
    }
}

/// The most buckets an owner whose share is `percent` may hold in a partition of `limit` buckets.
pub fn cap(limit: u32, percent: u32) -> u32 {
    let percent = percent.clamp(1, 100);
    (u64::from(limit) * u64::from(percent)).div_ceil(100).max(1) as u32
}

/// Who makes new buckets, and how many each of its owners may hold in the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Its database's OID.
    pub database: u32,
    /// Its role's OID.
    pub role: u32,
    /// Its database's cap ([`cap`] of `rate_limit.database_share`).
    pub database_cap: u32,
    /// Its role's cap ([`cap`] of `rate_limit.role_share`; the partition's limit for a superuser).
    pub role_cap: u32,
}

/// What a partition must free before `missing` new buckets of a caller fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// They fit.
    Enough,
    /// The database's cap would be exceeded: evict a bucket of the database (a full one, or the
    /// caller's role's own there).
    FromOwnDatabase,
    /// The role's cap would be exceeded: evict one of the role's own buckets.
    FromOwnRole,
    /// The partition is full: evict a full bucket of anyone.
    FullBucketOfAnyone,
}

impl Room {
    /// Decides for `missing` new buckets of `caller` in a partition holding `count` buckets of at most
    /// `limit`, counted in `owners`.
    pub fn needed<T: AsRef<[Count]>>(
        owners: &Owners<T>,
        count: u32,
        limit: u32,
        caller: &Caller,
        missing: u32,
    ) -> Room {
        if missing == 0 {
            Room::Enough
        } else if owners.database(caller.database) + missing > caller.database_cap {
            Room::FromOwnDatabase
        } else if owners.role(caller.role) + missing > caller.role_cap {
            Room::FromOwnRole
        } else if count + missing > limit {
            Room::FullBucketOfAnyone
        } else {
            Room::Enough
        }
    }
}

/// Why a partition could not make room: the 53200 error says which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRoom {
    /// The database's share is full and none of its buckets could be evicted.
    DatabaseShareFull,
    /// The role's share is full and none of its buckets could be evicted.
    RoleShareFull,
    /// The partition is full of buckets, none of them full.
    StoreFull,
}

/// Whether a role that holds `held` buckets in a partition of `limit`, under caps that let it hold
/// `own_cap` there, always finds room for a new one while another role whose cap is `other_cap` holds
/// any number of buckets, from any number of databases (and no third role holds any): true when both
/// caps fit in the partition together. With both shares at their 50% default, this holds for every
/// partition size.
pub fn victim_always_fits(limit: u32, own_cap: u32, other_cap: u32, held: u32) -> bool {
    held < own_cap && u64::from(own_cap) + u64::from(other_cap) <= u64::from(limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn owners(limit: u32) -> Owners<Vec<Count>> {
        Owners {
            databases: vec![Count::default(); table_len(limit)],
            roles: vec![Count::default(); table_len(limit)],
        }
    }

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
    fn owners_count_per_database_and_per_role() {
        let mut o = owners(8);
        assert!(o.add(7, 10) && o.add(7, 10) && o.add(9, 10) && o.add(7, 11));
        assert_eq!((o.database(7), o.database(9), o.database(8)), (3, 1, 0));
        assert_eq!((o.role(10), o.role(11), o.role(12)), (3, 1, 0));
        o.remove(9, 10);
        assert_eq!((o.database(9), o.role(10)), (0, 2));
        assert_eq!(each(&o.databases).collect::<Vec<_>>(), vec![(7, 3)]);
        o.remove(12345, 54321); // nothing to remove: no change
        assert_eq!(each(&o.roles).map(|(_, c)| c).sum::<u32>(), 3);
    }

    #[test]
    fn a_table_as_long_as_the_partition_always_has_room_for_one_more_owner() {
        // 8 buckets, each of its own database and role: every entry in use, so a 9th owner finds none
        let mut o = owners(8);
        for i in 0..8 {
            assert!(o.add(100 + i, 200 + i));
        }
        assert!(!o.add(5, 6), "no entry left: refused, nothing counted");
        assert_eq!((o.database(5), o.role(6)), (0, 0));
        assert!(
            !o.add(100, 6),
            "a known database, a new role: no entry for the role"
        );
        assert_eq!(
            o.database(100),
            1,
            "and the database was not counted either"
        );
        // but a partition of 8 only ever inserts its 8th bucket with at most 7 owners counted
        o.remove(107, 207);
        assert!(o.add(5, 6));
    }

    #[test]
    fn room_is_taken_from_the_share_that_is_full() {
        let mut o = owners(64);
        for _ in 0..32 {
            o.add(1, 10);
        }
        let caller = |database, role, database_cap, role_cap| Caller {
            database,
            role,
            database_cap,
            role_cap,
        };
        // database 1 at its cap of 32 in a 64-bucket partition: its own share must give
        assert_eq!(
            Room::needed(&o, 32, 64, &caller(1, 11, 32, 32), 1),
            Room::FromOwnDatabase
        );
        // role 10 at its cap from another database: its own buckets must give
        assert_eq!(
            Room::needed(&o, 32, 64, &caller(2, 10, 32, 32), 1),
            Room::FromOwnRole
        );
        // another role in another database fits
        assert_eq!(
            Room::needed(&o, 32, 64, &caller(2, 11, 32, 32), 1),
            Room::Enough
        );
        // a superuser (role cap = the limit) in another database fits too
        assert_eq!(
            Room::needed(&o, 32, 64, &caller(2, 10, 32, 64), 1),
            Room::Enough
        );
        // a partition filled by overcommitted shares: only full buckets may go
        assert_eq!(
            Room::needed(&o, 64, 64, &caller(2, 11, 40, 40), 1),
            Room::FullBucketOfAnyone
        );
        assert_eq!(
            Room::needed(&o, 64, 64, &caller(2, 11, 40, 40), 0),
            Room::Enough
        );
    }

    #[test]
    fn the_default_shares_leave_a_victim_half_of_every_partition() {
        for limit in [1u32, 2, 3, 63, 64, 65, 782, 7813, 8_388_608] {
            let half = cap(limit, 50);
            if limit >= 2 {
                // 50% + 50% fits exactly when the limit is even; an odd limit rounds both caps up
                assert_eq!(
                    victim_always_fits(limit, half, half, 0),
                    limit % 2 == 0,
                    "{limit}"
                );
                assert!(victim_always_fits(limit, limit - half, half, 0), "{limit}");
            }
        }
    }

    /// A partition's owner counts against a plain map: each owner's count is its number of buckets.
    #[derive(Clone, Debug)]
    enum Op {
        Add(u32, u32),
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..20, 0u32..20).prop_map(|(d, r)| Op::Add(d, r)),
            2 => (0usize..64).prop_map(Op::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// The count tables (open addressing, backward-shift deletion) against a list of buckets: after
        /// every operation, every database's and role's count is its number of buckets, and a partition
        /// that holds fewer buckets than its limit always counts a new one.
        #[test]
        fn count_tables_behave_like_a_list_of_buckets(
            limit in 1u32..24,
            ops in prop::collection::vec(op(), 1..300),
        ) {
            let mut o = owners(limit);
            let mut buckets: Vec<(u32, u32)> = Vec::new();
            for op in ops {
                match op {
                    Op::Add(d, r) if (buckets.len() as u32) < limit => {
                        prop_assert!(o.add(d, r), "{} buckets of {}", buckets.len(), limit);
                        buckets.push((d, r));
                    }
                    Op::Add(..) => {}
                    Op::Remove(i) if !buckets.is_empty() => {
                        let (d, r) = buckets.swap_remove(i % buckets.len());
                        o.remove(d, r);
                    }
                    Op::Remove(_) => {}
                }
                let mut per_db: HashMap<u32, u32> = HashMap::new();
                let mut per_role: HashMap<u32, u32> = HashMap::new();
                for (d, r) in &buckets {
                    *per_db.entry(*d).or_default() += 1;
                    *per_role.entry(*r).or_default() += 1;
                }
                for id in 0..20 {
                    prop_assert_eq!(o.database(id), per_db.get(&id).copied().unwrap_or(0));
                    prop_assert_eq!(o.role(id), per_role.get(&id).copied().unwrap_or(0));
                }
                prop_assert_eq!(each(&o.databases).count(), per_db.len());
                prop_assert_eq!(each(&o.roles).count(), per_role.len());
            }
        }

        /// The flood of the issue, in the model: an attacker role inserts as many buckets as the rules
        /// let it, from any number of databases, making room only as [`Room::needed`] allows (its own
        /// buckets, or full ones: here none is full); then a victim role in another database, within
        /// its own caps, always finds room when [`victim_always_fits`] says so, and none of its buckets
        /// was taken.
        #[test]
        fn one_role_flooding_from_any_number_of_databases_never_refuses_another(
            limit in 2u32..200,
            databases in 1u32..40,
            attacker_share in 1u32..=100,
            victim_share in 1u32..=100,
            victim_first in 0u32..100,
            flood in 1u32..600,
            lossy in any::<bool>(),
        ) {
            let mut o = owners(limit);
            let mut count = 0u32;
            let mut flooded = std::collections::VecDeque::new();
            const VICTIM_DB: u32 = 1_000;
            let victim = Caller {
                database: VICTIM_DB,
                role: 2,
                database_cap: cap(limit, victim_share),
                role_cap: cap(limit, victim_share),
            };
            // the victim's buckets before the flood
            let before = victim_first.min(victim.role_cap.saturating_sub(1)).min(limit - 1);
            for _ in 0..before {
                prop_assert_eq!(Room::needed(&o, count, limit, &victim, 1), Room::Enough);
                prop_assert!(o.add(VICTIM_DB, 2));
                count += 1;
            }
            // the flood: every database's cap at 100% (the worst case), the role at its share
            for i in 0..flood {
                let attacker = Caller {
                    database: i % databases,
                    role: 1,
                    database_cap: limit,
                    role_cap: cap(limit, attacker_share),
                };
                match Room::needed(&o, count, limit, &attacker, 1) {
                    Room::Enough => {
                        prop_assert!(o.add(attacker.database, 1));
                        flooded.push_back(attacker.database);
                        count += 1;
                    }
                    // its own oldest bucket goes (lossy), or the call is refused
                    Room::FromOwnRole | Room::FromOwnDatabase if lossy => {
                        let oldest = flooded.pop_front();
                        prop_assert!(oldest.is_some(), "a full share holds a bucket of its own");
                        o.remove(oldest.unwrap_or_default(), 1);
                        count -= 1;
                    }
                    // a full partition: no bucket is full, so nothing may go
                    _ => {}
                }
                prop_assert!(o.role(1) <= cap(limit, attacker_share));
            }
            prop_assert_eq!(o.role(2), before, "the victim's buckets are all there");
            let other_cap = cap(limit, attacker_share);
            if victim_always_fits(limit, victim.role_cap.min(victim.database_cap), other_cap, before) {
                prop_assert_eq!(Room::needed(&o, count, limit, &victim, 1), Room::Enough);
            }
        }
    }
}
