//! A map keyed by policy names for this backend's caches (the policies, which of them have overrides,
//! their statistics entries), with a fast hasher instead of the standard map's SipHash: each call hashes a
//! name into each of those maps, and SipHash, keyed so that nobody can choose keys that collide, costs
//! about 170 instructions for a short name where this costs about 20.
//!
//! Why an unkeyed hash is safe here: a map's keys are the names of policies that exist (a name nobody
//! created is looked up and not kept), and only the extension's owner creates policies, within the
//! policies' bound; so no caller can fill these maps with colliding keys. A map whose keys a caller sends
//! (the backend's memory of short buckets, the memory store's buckets) keeps a keyed hash. This module
//! imports nothing of the crate.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by policy names, hashed by [`NameHasher`]; `NameMap::with_hasher(Default::default())`
/// (or [`new`]) makes an empty one, also in a `const` context.
pub type NameMap<K, V> = HashMap<K, V, BuildHasherDefault<NameHasher>>;

/// An empty [`NameMap`] (a `const fn`, for a thread-local without lazy initialisation).
pub const fn new<K, V>() -> NameMap<K, V> {
    HashMap::with_hasher(BuildHasherDefault::new())
}

/// A multiply-rotate hash of eight bytes at a time (the one rustc uses for its own maps), with the high
/// bits folded into the low ones at the end, since the map picks its slot by the low bits.
#[derive(Clone, Copy, Default)]
pub struct NameHasher(u64);

/// An odd constant with its bits well spread (from rustc's FxHash).
const SEED: u64 = 0x517c_c1b7_2722_0a95;

impl NameHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            self.add(u64::from_le_bytes(w));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // the length tells "ab" from "ab\0"
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    fn hash(name: &str) -> u64 {
        BuildHasherDefault::<NameHasher>::new().hash_one(name)
    }

    #[test]
    fn a_map_of_many_names_finds_each_and_no_other() {
        let mut map: NameMap<String, usize> = new();
        for i in 0..20_000 {
            map.insert(format!("policy_{i}"), i);
        }
        assert!((0..20_000).all(|i| map.get(format!("policy_{i}").as_str()) == Some(&i)));
        assert_eq!(map.get("policy_20000"), None);
        assert_eq!(map.get(""), None);
    }

    #[test]
    fn names_that_differ_anywhere_hash_apart() {
        let names = [
            "",
            "a",
            "ab",
            "ab\0",
            "ba",
            "abcdefgh",
            "abcdefgh\0",
            "abcdefghi",
            "abcdefgi",
            "api",
            "apj",
            "login",
            "logim",
        ];
        let hashes: HashSet<u64> = names.iter().map(|n| hash(n)).collect();
        assert_eq!(hashes.len(), names.len());
        assert_eq!(hash("login"), hash("login"));
        // the low bits, which pick the slot, are spread too: 4 096 names over 256 slots
        let mut slots = [0u32; 256];
        for i in 0..4096 {
            slots[(hash(&format!("p{i}")) & 255) as usize] += 1;
        }
        assert!(slots.iter().all(|n| (4..=40).contains(n)), "{slots:?}");
    }
}
