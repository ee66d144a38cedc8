//! How often a batch checks for a cancel or `statement_timeout`: between keys, every
//! [`KEYS_BETWEEN_CHECKS`] of them (a check costs little, but a batch of a million keys must stop soon
//! after it is cancelled).

/// Checks for a cancel or `statement_timeout` when `n` (a batch's key number) is a multiple of
/// [`KEYS_BETWEEN_CHECKS`].
pub(super) fn check_every(n: usize) {
    if n.is_multiple_of(KEYS_BETWEEN_CHECKS) {
        pgrx::pg_sys::check_for_interrupts!();
    }
}

/// The number of the next key after `n` at which [`check_every`] checks.
pub(super) fn next_check_after(n: usize) -> usize {
    (n / KEYS_BETWEEN_CHECKS + 1) * KEYS_BETWEEN_CHECKS
}

/// How many keys a batch decides between two checks for a cancel or `statement_timeout`.
const KEYS_BETWEEN_CHECKS: usize = 4096;
