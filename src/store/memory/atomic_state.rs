//! A bucket's state in shared memory: its level and instant as one 128-bit word ([`AtomicState`]), so that
//! the lock-free path ([`super::cas`]) can swap it whole. A leaf: it imports no other room of the store.

use std::sync::atomic::Ordering;

use portable_atomic::AtomicU128;
use rate_limit_model::algorithm::State;

/// A bucket's state (level and instant) as one 128-bit word, so that it can be swapped atomically.
#[repr(transparent)]
pub struct AtomicState(AtomicU128);

impl AtomicState {
    /// A word holding `state`.
    pub fn new(state: State) -> AtomicState {
        AtomicState(AtomicU128::new(Self::pack(state)))
    }

    fn pack(state: State) -> u128 {
        (u128::from(state.at as u64) << 64) | u128::from(state.level as u64)
    }

    fn unpack(word: u128) -> State {
        State {
            level: word as u64 as i64,
            at: (word >> 64) as u64 as i64,
        }
    }

    /// The state now.
    pub fn load(&self) -> State {
        Self::unpack(self.0.load(Ordering::Acquire))
    }

    /// Writes `state` (under the exclusive lock, or when nobody else can see the slot).
    pub fn store(&self, state: State) {
        self.0.store(Self::pack(state), Ordering::Release);
    }

    /// Replaces `current` with `new` if the word still holds `current`; false if it changed meanwhile.
    pub fn swap_if(&self, current: State, new: State) -> bool {
        self.0
            .compare_exchange(
                Self::pack(current),
                Self::pack(new),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Whether swaps are lock-free on this CPU. Only then may two processes swap the same word concurrently:
    /// the fallback of `portable_atomic` locks process-local memory, which processes do not share.
    pub fn swaps_are_lock_free() -> bool {
        AtomicU128::is_lock_free()
    }
}
