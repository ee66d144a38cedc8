//! Which policies may hold a block by hand in the memory store: one bit per policy out of [`BITS`], chosen
//! by a hash of the database, the policy's name and its creation time, set by `block`, saved and loaded
//! with the store's buckets (a file of 0.4.0, which does not keep it, sets every bit when it holds a
//! block), and never cleared while the server runs. A call of a policy without a penalty box reads its
//! key's block only when its policy's bit is set, so a block by hand on one policy does not make every
//! other policy's calls, in every database, read a block too. Two policies may share a bit: both then
//! read their keys' blocks, which costs a read and decides the same.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use rate_limit_model::target::Namespace;

/// Words of the bitmap (1 024 bits, 128 bytes of the segment's header).
pub const WORDS: usize = 16;
/// Bits of the bitmap.
const BITS: u64 = WORDS as u64 * 64;

/// The bitmap, in the segment's header.
#[repr(C)]
pub struct HandBlocks([AtomicU64; WORDS]);

impl HandBlocks {
    /// No policy noted.
    pub fn new() -> HandBlocks {
        HandBlocks(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    /// Notes that a key of `namespace` (in `database`) was blocked by hand; any other namespace notes
    /// them all.
    pub fn note(&self, database: u32, namespace: &Namespace<'_>) {
        let bit = Bit::of(database, namespace);
        if bit.mask == 0 {
            self.note_all();
        } else {
            self.0[bit.word].fetch_or(bit.mask, Ordering::Relaxed);
        }
    }

    /// Notes every policy (blocks were loaded from a saved store, whose names the buckets do not keep).
    pub fn note_all(&self) {
        for word in &self.0 {
            word.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// The bitmap's words now, to be saved with the store's buckets.
    pub fn words(&self) -> [u64; WORDS] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }

    /// Notes the policies of saved `words` (loaded with the buckets that hold their blocks).
    pub fn restore(&self, words: &[u64; WORDS]) {
        for (word, saved) in self.0.iter().zip(words) {
            word.fetch_or(*saved, Ordering::Relaxed);
        }
    }

    /// Whether a key of `namespace` (in `database`) may have been blocked by hand: true for any namespace
    /// but a policy's. The bits of the last few policies asked about are remembered
    /// ([`Bit::of_recent`]): every call of a policy without a penalty box asks.
    pub fn may_hold(&self, database: u32, namespace: &Namespace<'_>) -> bool {
        self.is_set(Bit::of_recent(database, namespace))
    }

    /// Whether `bit` is set now (always for the bit of a namespace that is not a policy's).
    pub fn is_set(&self, bit: Bit) -> bool {
        bit.mask == 0 || self.0[bit.word].load(Ordering::Relaxed) & bit.mask != 0
    }
}

/// A namespace's bit, computed once to be read again and again (a run over many keys).
#[derive(Clone, Copy)]
pub struct Bit {
    word: usize,
    /// 0 for a namespace that is not a policy's (it always reads blocks).
    mask: u64,
}

/// The longest policy name [`Bit::of_recent`] remembers (a policy's name is at most 63 bytes).
const NAME_BYTES: usize = 64;
/// How many policies [`Bit::of_recent`] remembers: enough for the calls of a few policies that take
/// turns (a call of several policies asks for each), few enough to be compared one by one.
const REMEMBERED: usize = 4;

/// A policy [`Bit::of_recent`] was asked about, and its bit; the name kept in place (no allocation).
#[derive(Clone, Copy)]
struct Asked {
    database: u32,
    created_at: i64,
    len: usize,
    name: [u8; NAME_BYTES],
    bit: Bit,
}

impl Asked {
    fn is(&self, database: u32, created_at: i64, name: &str) -> bool {
        self.created_at == created_at
            && self.database == database
            && self.name[..self.len] == *name.as_bytes()
    }
}

/// The policies asked about last, and the slot the next new one replaces.
struct Recent {
    asked: [Option<Asked>; REMEMBERED],
    next: usize,
}

thread_local! {
    /// The policies [`Bit::of_recent`] was asked about last in this backend.
    static RECENT: RefCell<Recent> = const {
        RefCell::new(Recent {
            asked: [None; REMEMBERED],
            next: 0,
        })
    };
}

impl Bit {
    /// [`Bit::of`], remembered for the last few policies asked about: a bit depends on nothing but the
    /// database, the policy's creation time and its name, which are compared (a few instructions, where
    /// hashing them byte by byte costs about three hundred). Not a cache that can go stale: a policy
    /// dropped and created again has another creation time, so another entry.
    pub fn of_recent(database: u32, namespace: &Namespace<'_>) -> Bit {
        let Namespace::Policy { name, created_at } = namespace else {
            return Bit::of(database, namespace);
        };
        if name.len() > NAME_BYTES {
            return Bit::of(database, namespace);
        }
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            let known = recent
                .asked
                .iter()
                .flatten()
                .find(|a| a.is(database, *created_at, name));
            if let Some(a) = known {
                return a.bit;
            }
            let bit = Bit::of(database, namespace);
            let mut asked = Asked {
                database,
                created_at: *created_at,
                len: name.len(),
                name: [0; NAME_BYTES],
                bit,
            };
            asked.name[..name.len()].copy_from_slice(name.as_bytes());
            let slot = recent.next;
            recent.asked[slot] = Some(asked);
            recent.next = (slot + 1) % REMEMBERED;
            bit
        })
    }

    /// The bit of `namespace` in `database`: for a policy, an FNV-1a hash of the database, its creation
    /// time and its name (cheap, and a collision only makes a policy read blocks; blocks by hand are made
    /// by the extension's owner only).
    pub fn of(database: u32, namespace: &Namespace<'_>) -> Bit {
        let Namespace::Policy { name, created_at } = namespace else {
            return Bit { word: 0, mask: 0 };
        };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let bytes = database
            .to_le_bytes()
            .into_iter()
            .chain(created_at.to_le_bytes())
            .chain(name.bytes());
        for b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let bit = h % BITS;
        Bit {
            word: (bit / 64) as usize,
            mask: 1 << (bit % 64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str) -> Namespace<'_> {
        Namespace::Policy {
            name,
            created_at: 42,
        }
    }

    #[test]
    fn a_block_by_hand_notes_its_policy_only() {
        let notes = HandBlocks::new();
        assert!(!notes.may_hold(5, &policy("login")));
        notes.note(5, &policy("login"));
        assert!(notes.may_hold(5, &policy("login")));
        // the same name in another database, or another incarnation of the policy, is another bit
        let others = (0..200u32).filter(|db| notes.may_hold(*db + 6, &policy("login")));
        assert!(others.count() < 5, "at most a collision or two");
        let names: Vec<String> = (0..200).map(|i| format!("p{i}")).collect();
        let noted = names.iter().filter(|n| notes.may_hold(5, &policy(n)));
        assert!(noted.count() < 5, "at most a collision or two");
    }

    #[test]
    fn namespaces_that_are_not_policies_always_read_blocks() {
        let notes = HandBlocks::new();
        assert!(notes.may_hold(5, &Namespace::AdHoc));
        assert!(notes.may_hold(5, &Namespace::Request));
        notes.note(5, &Namespace::AdHoc);
        assert!(notes.may_hold(5, &policy("any")));
    }

    #[test]
    fn a_saved_bitmap_restores_the_same_policies_and_no_other() {
        let notes = HandBlocks::new();
        notes.note(5, &policy("login"));
        notes.note(7, &policy("search"));
        let restored = HandBlocks::new();
        restored.restore(&notes.words());
        assert_eq!(restored.words(), notes.words());
        assert!(restored.may_hold(5, &policy("login")) && restored.may_hold(7, &policy("search")));
        let names: Vec<String> = (0..200).map(|i| format!("p{i}")).collect();
        let noted = names.iter().filter(|n| restored.may_hold(5, &policy(n)));
        assert!(noted.count() < 5, "at most a collision or two");
    }

    #[test]
    fn the_remembered_bit_is_the_bit_of_the_policy_asked_about() {
        // more policies than are remembered, taking turns, asked again and again; a name of the longest
        // remembered length and one longer
        let long = "p".repeat(NAME_BYTES);
        let longer = "p".repeat(NAME_BYTES + 1);
        let names = [
            "login",
            "search",
            "logi",
            "loginx",
            "api",
            "",
            long.as_str(),
            longer.as_str(),
        ];
        for round in 0..3 {
            for name in names.iter().chain(names.iter().rev()) {
                for database in [5, 6] {
                    for created_at in [42, 43] {
                        let namespace = Namespace::Policy { name, created_at };
                        let (of, recent) = (
                            Bit::of(database, &namespace),
                            Bit::of_recent(database, &namespace),
                        );
                        assert_eq!(
                            (recent.word, recent.mask),
                            (of.word, of.mask),
                            "round {round}: {name} {database} {created_at}"
                        );
                    }
                }
            }
        }
        let notes = HandBlocks::new();
        notes.note(5, &policy("login"));
        assert!(notes.may_hold(5, &policy("login")));
        assert!(!notes.may_hold(5, &policy("search")) && notes.may_hold(5, &Namespace::AdHoc));
    }

    #[test]
    fn loading_saved_blocks_of_an_older_file_notes_every_policy() {
        let notes = HandBlocks::new();
        notes.note_all();
        assert!((0..100).all(|i| notes.may_hold(i, &policy(&format!("p{i}")))));
    }
}
