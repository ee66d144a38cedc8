//! The slot table of one partition, as safe code over slices: linear probing, insertion, backward-shift
//! deletion (no tombstones, so a probe stops at the first empty slot) and eviction from a moving hand, with
//! each database's and role's bucket counts ([`Owners`]) kept in step. The guards hand these slices out only under
//! the partition's lock; the model test below drives them directly, without PostgreSQL.

use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip128::{Hasher128, SipHasher13};

use super::atomic_state::AtomicState;
use crate::backend::{current_database, current_role};
use rate_limit_model::algorithm::{Algorithm, Policy, State};
use rate_limit_model::shares::{Count, Owners};
use rate_limit_model::target::{owning_policy, Kind, Namespace, Stored};

/// Slots an insert into a full partition examines at most to find a bucket to evict.
pub const EVICTION_SCAN: usize = 128;

/// Bytes of an id kept in a slot for display (what keeps a slot at 96 bytes).
pub const ID_PREFIX: usize = 24;

/// `Slot::used` values: what kind of bucket a slot holds (0 is an empty slot).
pub(super) const KIND_REQUEST: u8 = 1;
pub(super) const KIND_AD_HOC: u8 = 2;
pub(super) const KIND_POLICY: u8 = 3;

/// One bucket. `used` is 0 for an empty slot, else the kind of bucket (`KIND_*`). The numbers (`algorithm`,
/// `rate`, `period_us`, `burst`) are those the level was last written under (see `rate_limit_model::algorithm`); only
/// `state` changes while the partition is locked SHARED.
#[repr(C)]
pub(super) struct Slot {
    pub hash: [u64; 2],
    pub state: AtomicState,
    pub rate: i64,
    pub period_us: i64,
    pub burst: i64,
    pub database: u32,
    /// The login role of the session that made the bucket (0 for one restored from a snapshot of 0.3.0).
    pub role: u32,
    pub policy_tag: u32,
    pub used: u8,
    pub algorithm: u8,
    pub id_len: u8,
    pub id_truncated: u8,
    pub id_prefix: [u8; ID_PREFIX],
}

impl Clone for Slot {
    fn clone(&self) -> Slot {
        Slot {
            hash: self.hash,
            state: AtomicState::new(self.state.load()),
            rate: self.rate,
            period_us: self.period_us,
            burst: self.burst,
            database: self.database,
            role: self.role,
            policy_tag: self.policy_tag,
            used: self.used,
            algorithm: self.algorithm,
            id_len: self.id_len,
            id_truncated: self.id_truncated,
            id_prefix: self.id_prefix,
        }
    }
}

/// Bytes of one slot.
pub const SLOT_BYTES: usize = size_of::<Slot>();

/// Per-partition bookkeeping, protected by the partition's lock.
#[repr(C)]
pub(super) struct PartitionHeader {
    /// Buckets in the partition.
    pub count: u32,
    /// Where the next eviction scan starts.
    pub hand: u32,
}

/// How many buckets inserts have evicted, over the whole store (in its header; read by `usage`).
#[repr(C)]
pub(super) struct Evictions {
    /// Full buckets evicted (nothing lost: a missing bucket is full).
    pub lossless: AtomicU64,
    /// Buckets evicted that were not full (their callers get a full bucket again).
    pub lossy: AtomicU64,
}

impl Evictions {
    /// No eviction yet.
    pub fn new() -> Evictions {
        Evictions {
            lossless: AtomicU64::new(0),
            lossy: AtomicU64::new(0),
        }
    }
}

/// Where a probe ended.
pub(super) enum Probe {
    /// The bucket is in this slot.
    Found(usize),
    /// It is missing; this empty slot ends its probe chain.
    Empty(usize),
}

/// The slot where `hash`'s probe chain starts.
fn home(slots: &[Slot], hash: &[u64; 2]) -> usize {
    (hash[1] % slots.len() as u64) as usize
}

/// Finds `hash` in a partition's slots, or the empty slot that ends its probe chain.
pub(super) fn probe(slots: &[Slot], hash: &[u64; 2]) -> Probe {
    let n = slots.len();
    let start = home(slots, hash);
    for i in 0..n {
        let idx = (start + i) % n;
        let slot = &slots[idx];
        if slot.used == 0 {
            return Probe::Empty(idx);
        }
        if slot.hash == *hash {
            return Probe::Found(idx);
        }
    }
    // unreachable while count <= limit < slots; an empty slot is always found
    Probe::Empty(start)
}

/// Whose buckets: of a database, of a role, of both, or (neither given) of anyone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Whose {
    pub database: Option<u32>,
    pub role: Option<u32>,
}

impl Whose {
    /// Every bucket.
    pub const ANYONE: Whose = Whose {
        database: None,
        role: None,
    };

    fn matches(&self, s: &Slot) -> bool {
        self.database.is_none_or(|d| d == s.database) && self.role.is_none_or(|r| r == s.role)
    }
}

/// Which buckets an eviction may take: a full one of `full` (nothing is lost), else, if `oldest` is
/// given, the least recently updated of `oldest` (lossy: that key starts full again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Evict {
    pub full: Whose,
    pub oldest: Option<Whose>,
}

impl Evict {
    /// A full bucket of anyone: what a full partition may give without losing anything.
    pub const FULL_OF_ANYONE: Evict = Evict {
        full: Whose::ANYONE,
        oldest: None,
    };
}

/// A partition's slot table, writable: what an exclusive guard gives access to.
pub(super) struct Partition<'a> {
    pub header: &'a mut PartitionHeader,
    /// Buckets per database and per role (the shares).
    pub owners: Owners<&'a mut [Count]>,
    pub slots: &'a mut [Slot],
    /// Buckets the partition may hold.
    pub limit: u32,
}

impl Partition<'_> {
    /// Finds `hash`, or the empty slot that ends its probe chain.
    pub fn probe(&self, hash: &[u64; 2]) -> Probe {
        probe(self.slots, hash)
    }

    /// Puts `slot` into the empty slot `idx` that ends its probe chain and counts it for its database and
    /// role. The caller has checked that the partition holds fewer buckets than its limit, so both owner
    /// tables have an entry free; if not, nothing is inserted and false is returned.
    pub fn insert(&mut self, idx: usize, slot: Slot) -> bool {
        if self.header.count >= self.limit || !self.owners.add(slot.database, slot.role) {
            return false;
        }
        self.slots[idx] = slot;
        self.header.count += 1;
        true
    }

    /// Removes slot `hole`, shifting later entries of its probe chain back (no tombstones).
    pub fn remove(&mut self, mut hole: usize) {
        let n = self.slots.len();
        self.owners
            .remove(self.slots[hole].database, self.slots[hole].role);
        self.slots[hole].used = 0;
        self.header.count = self.header.count.saturating_sub(1);
        let mut j = hole;
        loop {
            j = (j + 1) % n;
            if self.slots[j].used == 0 {
                return;
            }
            let home = home(self.slots, &self.slots[j].hash);
            // the entry at j may move to the hole unless its home lies cyclically in (hole, j]
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j].clone();
                self.slots[j].used = 0;
                hole = j;
            }
        }
    }

    /// Removes every bucket for which `doomed(slot, now)` holds; returns how many.
    pub fn remove_where(&mut self, mut doomed: impl FnMut(&Slot) -> bool) -> i64 {
        let mut removed = 0;
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].used != 0 && doomed(&self.slots[i]) {
                self.remove(i); // an entry may have moved into i: look at i again
                removed += 1;
            } else {
                i += 1;
            }
        }
        removed
    }

    /// Frees one slot, among the [`EVICTION_SCAN`] slots examined from the hand, as `evict` allows: a
    /// bucket of `evict.full` that is full now first; else, if `evict.oldest` is given, its least recently
    /// updated one. Buckets whose hash is in `protect` (those of the call) are never evicted.
    /// Returns false if nothing may be evicted.
    pub fn make_room(
        &mut self,
        now: i64,
        evict: Evict,
        evictions: &Evictions,
        protect: &[[u64; 2]],
    ) -> bool {
        let n = self.slots.len();
        let start = self.header.hand as usize % n;
        let scan = EVICTION_SCAN.min(n);
        let mut oldest: Option<usize> = None;
        for step in 0..scan {
            let i = (start + step) % n;
            let s = &self.slots[i];
            if s.used == 0 || protect.contains(&s.hash) {
                continue;
            }
            if evict.full.matches(s) && slot_is_full(s, now) {
                self.header.hand = ((i + 1) % n) as u32;
                self.remove(i);
                evictions.lossless.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            if evict.oldest.is_some_and(|w| w.matches(s))
                && oldest.is_none_or(|o| s.state.load().at < self.slots[o].state.load().at)
            {
                oldest = Some(i);
            }
        }
        self.header.hand = ((start + scan) % n) as u32;
        if let Some(i) = oldest {
            self.remove(i);
            evictions.lossy.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// The numbers a slot's level was written under.
pub(super) fn slot_policy(slot: &Slot) -> Option<Policy> {
    let algorithm = Algorithm::from_code(slot.algorithm)?;
    Policy::new(algorithm, slot.rate, slot.period_us, slot.burst).ok()
}

/// Whether the slot's bucket is full at `now` (and may be deleted losslessly).
pub(super) fn slot_is_full(slot: &Slot, now: i64) -> bool {
    slot_policy(slot).is_some_and(|p| p.is_full(slot.state.load(), now))
}

/// The slot's bucket as stored (state and numbers), if its numbers are valid.
pub(super) fn stored_of(slot: &Slot) -> Option<Stored> {
    slot_policy(slot).map(|policy| Stored {
        state: slot.state.load(),
        policy,
    })
}

/// The kind byte of a namespace's buckets (the slot's `used`, also in snapshots).
pub(super) fn kind_of(namespace: &Namespace<'_>) -> u8 {
    match namespace.kind() {
        Kind::Policy => KIND_POLICY,
        Kind::AdHoc => KIND_AD_HOC,
        Kind::Request => KIND_REQUEST,
    }
}

/// The kind of a used slot's kind byte.
pub(super) fn kind_from_byte(kind: u8) -> Kind {
    match kind {
        KIND_POLICY => Kind::Policy,
        KIND_AD_HOC => Kind::AdHoc,
        _ => Kind::Request,
    }
}

/// A 32-bit tag of a policy incarnation, kept in its slots to name the policy when listing.
pub fn policy_tag(name: &str, created_at: i64) -> u32 {
    if name.is_empty() {
        return 0;
    }
    let mut hasher = SipHasher13::new_with_keys(0, 0);
    hasher.write_i64(created_at);
    hasher.write(name.as_bytes());
    (hasher.finish128().h1 & 0xFFFF_FFFF) as u32
}

/// Writes the numbers of `policy` into a slot, with the level they go with.
pub(super) fn write_policy(slot: &mut Slot, policy: &Policy) {
    slot.algorithm = policy.algorithm().code();
    slot.rate = policy.rate();
    slot.period_us = policy.period_us();
    slot.burst = policy.burst();
}

/// A new slot of the current database and role for `hash` of `namespace`, holding `state` under `policy`.
pub(super) fn new_slot(
    hash: [u64; 2],
    namespace: &Namespace<'_>,
    id: &str,
    policy: &Policy,
    state: State,
) -> Slot {
    let (prefix, prefix_len) = id_prefix(id);
    let tag = match namespace {
        // a lease slot or block bucket is tagged as its policy: listed, and freed when it is dropped
        Namespace::Policy { name, created_at } => policy_tag(owning_policy(name), *created_at),
        Namespace::AdHoc | Namespace::Request => 0,
    };
    let mut slot = Slot {
        hash,
        state: AtomicState::new(state),
        rate: 0,
        period_us: 0,
        burst: 0,
        database: current_database(),
        role: current_role(),
        policy_tag: tag,
        used: kind_of(namespace),
        algorithm: 0,
        id_len: prefix_len,
        id_truncated: u8::from(usize::from(prefix_len) < id.len()),
        id_prefix: prefix,
    };
    write_policy(&mut slot, policy);
    slot
}

/// The first bytes of `id` (at most [`ID_PREFIX`], cut at a character boundary) and their length.
pub(super) fn id_prefix(id: &str) -> ([u8; ID_PREFIX], u8) {
    let mut end = id.len().min(ID_PREFIX);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    let mut prefix = [0u8; ID_PREFIX];
    prefix[..end].copy_from_slice(&id.as_bytes()[..end]);
    (prefix, end as u8)
}

/// A slot's key for display: its first bytes, followed by `…` when it was longer than [`ID_PREFIX`].
pub(super) fn shown_key(s: &Slot) -> String {
    let mut key = String::from_utf8_lossy(&s.id_prefix[..s.id_len as usize]).into_owned();
    if s.id_truncated != 0 {
        key.push('…');
    }
    key
}

#[cfg(test)]
mod tests {
    use super::super::segment::Geometry;
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const S: i64 = 1_000_000;

    /// A slot of `database` (made by role `database + 10`) holding the key `k` under the hash (k, k).
    fn slot(key: u64, database: u32, state: State, policy: &Policy) -> Slot {
        let mut s = Slot {
            hash: [key, key],
            state: AtomicState::new(state),
            rate: 0,
            period_us: 0,
            burst: 0,
            database,
            role: database + 10,
            policy_tag: 0,
            used: KIND_AD_HOC,
            algorithm: 0,
            id_len: 0,
            id_truncated: 0,
            id_prefix: [0; ID_PREFIX],
        };
        write_policy(&mut s, policy);
        s
    }

    fn empty_slot() -> Slot {
        let p = Policy::new(Algorithm::TokenBucket, 1, S, 1).unwrap();
        let mut s = slot(0, 0, State { level: 0, at: 0 }, &p);
        s.used = 0;
        s
    }

    fn stats() -> Evictions {
        Evictions::new()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u32, bool),
        Remove(u64),
        MakeRoom(Evict),
    }

    fn op() -> impl Strategy<Value = Op> {
        let whose = (prop::option::of(1u32..3), prop::option::of(11u32..13))
            .prop_map(|(database, role)| Whose { database, role });
        let evict = prop_oneof![
            (whose.clone(), prop::option::of(whose))
                .prop_map(|(full, oldest)| Evict { full, oldest }),
            Just(Evict::FULL_OF_ANYONE),
        ];
        prop_oneof![
            3 => (0u64..40, 1u32..3, any::<bool>()).prop_map(|(k, db, full)| Op::Insert(k, db, full)),
            2 => (0u64..40).prop_map(Op::Remove),
            1 => evict.prop_map(Op::MakeRoom),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// The slot table (linear probing, backward-shift deletion, eviction from a moving hand) against a
        /// map of key -> (database, state): after every operation each key of the map is found with its
        /// state, no other key is found, the count is the number of used slots, each database's count is
        /// its number of keys, and an eviction took only what it was allowed to.
        #[test]
        fn slot_table_behaves_like_a_map(ops in prop::collection::vec(op(), 1..200)) {
            let policy = Policy::new(Algorithm::TokenBucket, 1, S, 10).unwrap();
            let full = policy.full(0);
            let short = policy.take(full, 0, 3).state;
            let mut header = PartitionHeader { count: 0, hand: 0 };
            let (mut databases, mut roles) = (vec![Count::default(); 8], vec![Count::default(); 8]);
            let mut slots: Vec<Slot> = (0..11).map(|_| empty_slot()).collect();
            let mut part = Partition {
                header: &mut header,
                owners: Owners { databases: &mut databases, roles: &mut roles },
                slots: &mut slots,
                limit: 8,
            };
            let stats = stats();
            let mut model: HashMap<u64, (u32, State)> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, db, is_full) => {
                        let state = if is_full { full } else { short };
                        match part.probe(&[k, k]) {
                            Probe::Found(i) => {
                                part.slots[i].state.store(state);
                                let owner = model[&k].0;
                                model.insert(k, (owner, state));
                            }
                            Probe::Empty(i) if part.header.count < part.limit => {
                                prop_assert!(part.insert(i, slot(k, db, state, &policy)));
                                model.insert(k, (db, state));
                            }
                            Probe::Empty(_) => {}
                        }
                    }
                    Op::Remove(k) => {
                        if let Probe::Found(i) = part.probe(&[k, k]) {
                            part.remove(i);
                        }
                        model.remove(&k);
                    }
                    Op::MakeRoom(evict) => {
                        let of = |w: Whose, db: u32| {
                            w.database.is_none_or(|d| d == db) && w.role.is_none_or(|r| r == db + 10)
                        };
                        let allowed = |db: u32, state: State| {
                            (of(evict.full, db) && state == full) || evict.oldest.is_some_and(|w| of(w, db))
                        };
                        let could = model.values().any(|(db, s)| allowed(*db, *s));
                        let freed = part.make_room(0, evict, &stats, &[]);
                        // every slot is examined here (11 < EVICTION_SCAN)
                        prop_assert_eq!(freed, could);
                        if freed {
                            let gone: Vec<u64> = model
                                .keys()
                                .copied()
                                .filter(|k| matches!(part.probe(&[*k, *k]), Probe::Empty(_)))
                                .collect();
                            prop_assert_eq!(gone.len(), 1);
                            let (db, state) = model.remove(&gone[0]).unwrap();
                            prop_assert!(allowed(db, state), "evicted ({}, {:?}) under {:?}", db, state, evict);
                            // a full bucket goes first whenever one may go
                            let full_left = model.values().any(|(d, s)| *s == full && of(evict.full, *d));
                            prop_assert!(state == full || !full_left);
                        }
                    }
                }
                prop_assert_eq!(part.header.count as usize, model.len());
                prop_assert_eq!(part.slots.iter().filter(|s| s.used != 0).count(), model.len());
                for db in 1..3u32 {
                    let keys = model.values().filter(|(d, _)| *d == db).count();
                    prop_assert_eq!(part.owners.database(db) as usize, keys);
                    prop_assert_eq!(part.owners.role(db + 10) as usize, keys);
                }
                for k in 0..40u64 {
                    match (part.probe(&[k, k]), model.get(&k)) {
                        (Probe::Found(i), Some((_, state))) => prop_assert_eq!(part.slots[i].state.load(), *state),
                        (Probe::Empty(_), None) => {}
                        (_, expected) => prop_assert!(false, "key {} expected {:?}", k, expected),
                    }
                }
            }
        }
    }

    #[test]
    fn geometry_fits_144_bytes_per_bucket() {
        assert_eq!(SLOT_BYTES, 96);
        for max in [64u32, 1000, 100_000, 1_000_000, 10_000_000] {
            let g = Geometry::for_max_buckets(max);
            assert!(g.partitions >= 1 && g.partitions <= 128);
            assert!(g.partitions * g.limit_per_partition >= max);
            assert!(g.slots_per_partition > g.limit_per_partition);
            let per_bucket = g.segment_bytes() as f64 / f64::from(max);
            // 96-byte slots with 25% to spare, and 16 bytes of owner counts per bucket (the shares)
            assert!(per_bucket <= 144.0, "{max}: {per_bucket} bytes per bucket");
        }
    }

    #[test]
    fn id_prefix_cuts_at_a_character_boundary() {
        let (p, n) = id_prefix("short");
        assert_eq!(&p[..n as usize], b"short");
        let long = "é".repeat(30); // 60 bytes
        let (p, n) = id_prefix(&long);
        assert_eq!(n, 24);
        assert!(std::str::from_utf8(&p[..n as usize]).is_ok());
        let odd = format!("a{}", "é".repeat(30)); // the 24th byte falls inside a character
        let (p, n) = id_prefix(&odd);
        assert_eq!(n, 23);
        assert!(std::str::from_utf8(&p[..n as usize]).is_ok());
    }
}
