//! Concurrency leases: `acquire` takes one of a concurrency policy's leases of a key, `release` gives it
//! back before it expires. A policy `create_policy(name, N, ttl, algorithm => 'concurrency')` lets at most
//! N leases of a key be held at once, each expiring `ttl` after it was acquired (see
//! [`rate_limit_model::algorithm::lease`]). Any role may call both: a release needs the lease's id, which only the
//! acquire that got it returned.

use std::cell::RefCell;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::{combine, key_arg, lease_policy_arg, store_of, to_row, with_override};
use crate::error;
use crate::store;

thread_local! {
    /// This backend's stream of lease ids, seeded on its first `acquire` (see [`random_bits`]).
    static LEASE_IDS: RefCell<Option<ChaCha20Rng>> = const { RefCell::new(None) };
}

/// 64 random bits for a lease id: the next of this backend's ChaCha20 stream, seeded with 256 bits of
/// PostgreSQL's strong random source on the backend's first `acquire` (in the backend, after its fork, so
/// that no two backends share a stream). Unguessable as the strong source is, without its cost on every
/// call: a build without OpenSSL reads `/dev/urandom` through open, read and close, about 40% of an
/// `acquire`.
pub(super) fn random_bits(function: &'static str) -> Result<u64, ErrorReport> {
    LEASE_IDS.with(|ids| {
        let mut ids = ids.borrow_mut();
        let rng = match ids.as_mut() {
            Some(rng) => rng,
            None => {
                let mut seed = [0u8; 32];
                // SAFETY: pg_strong_random writes exactly `len` bytes into the buffer it is given, which
                // is a valid, writable local of that size.
                let ok = unsafe { pg_sys::pg_strong_random(seed.as_mut_ptr().cast(), seed.len()) };
                if !ok {
                    return Err(error::bug(function, "no random bytes for lease ids"));
                }
                ids.insert(ChaCha20Rng::from_seed(seed))
            }
        };
        Ok(rng.next_u64())
    })
}

/// Leases of concurrency policies, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Acquires one of the leases of `key` under the concurrency policy `policy`: the decision, with the
    /// lease's id in `lease` when allowed (pass it to `rate_limit.release`); `remaining` is the leases
    /// still free, `retry_after` (denied) the time until the first held lease expires, `reset_after` until
    /// the last one does. In the table store a lease acquired in a transaction that rolls back is released.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn acquire(
        policy: Option<&str>,
        key: Option<&str>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.acquire";
        let named = lease_policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let t = with_override(&named, key, None);
        let (outcome, lease) = store::acquire(F, store_of(Some(&named)), &t, random_bits(F)?)?;
        let mut d = combine(&[t], &[outcome]);
        d.lease = lease;
        to_row(F, &d)
    }

    /// Releases lease `lease` of `key` under the concurrency policy `policy`: true if it was held and is
    /// now free, false if it had expired or been released already.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn release(
        policy: Option<&str>,
        key: Option<&str>,
        lease: Option<i64>,
    ) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.release";
        let named = lease_policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let lease = lease.ok_or_else(|| {
            error::null_argument(
                F,
                "lease",
                "Pass the lease that rate_limit.acquire returned.",
            )
        })?;
        let t = with_override(&named, key, None);
        store::release(F, store_of(Some(&named)), &t, lease)
    }
}
