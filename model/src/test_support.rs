//! What the model's simulations share (tests only).

/// A small deterministic generator (a simulation's jitter and pauses), seeded by a property's input.
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    /// A number in `0..n` (0 when `n` is not positive).
    pub(crate) fn below(&mut self, n: i64) -> i64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        i64::try_from((self.0 >> 33) % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0)
    }
}
