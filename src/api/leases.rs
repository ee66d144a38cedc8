//! Concurrency leases: `acquire` takes one of a concurrency policy's leases of a key, `release` gives it
//! back before it expires. A policy `create_policy(name, N, ttl, algorithm => 'concurrency')` lets at most
//! N leases of a key be held at once, each expiring `ttl` after it was acquired (see
//! [`rate_limit_model::algorithm::lease`]). Any role may call both: a release needs the lease's id, which only the
//! acquire that got it returned.
//!
//! With the option `latency_target` the policy is adaptive ([`rate_limit_model::algorithm::adaptive`]):
//! each key's limit moves between `adaptive_min` and N from what `release` reports (`outcome`, `latency`).

use std::cell::RefCell;

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::{combine, key_arg, lease_policy_arg, store_of, to_row, with_override};
use crate::error;
use crate::policies::Named;
use crate::store;
use rate_limit_model::algorithm::{limit_namespace, Adaptive, Policy, Report};
use rate_limit_model::pipeline::single::{CallReport, KeyLimit};
use rate_limit_model::target::{Namespace, Target};

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

/// The adaptive limit of the key of `target` under `named` (an adaptive policy's, else `None`), its bucket
/// in namespace `namespace` ([`limit_namespace`] of the policy).
fn key_limit<'a>(
    function: &'static str,
    named: &Named,
    target: &Target<'a>,
    namespace: &'a str,
) -> Result<Option<KeyLimit<'a>>, ErrorReport> {
    let Some(settings) = named.adaptive else {
        return Ok(None);
    };
    let policy = target.policy;
    let numbers = Policy::adaptive_limit(policy.rate(), policy.period_us())
        .map_err(|e| crate::policies::policy_error(function, e))?;
    let settings = Adaptive::new(
        settings.min().min(policy.rate()),
        policy.rate(),
        settings.target_us(),
    )
    .unwrap_or(settings);
    Ok(Some(KeyLimit {
        bucket: Target {
            namespace: Namespace::Policy {
                name: namespace,
                created_at: target.namespace.created_at(),
            },
            policy: numbers,
            shadow: false,
            blocking: None,
            verdict: None,
            ..*target
        },
        settings,
    }))
}

/// How a call went, from `release`'s `outcome`: 22004 for NULL, 22023 for a word it does not know.
fn report_arg(function: &'static str, outcome: Option<&str>) -> Result<Report, ErrorReport> {
    let outcome = outcome.ok_or_else(|| {
        error::null_argument(
            function,
            "outcome",
            "Pass 'ok', 'dropped' or 'timeout', or leave it out ('ok').",
        )
    })?;
    Report::parse(outcome).ok_or_else(|| {
        error::invalid_value(
            function,
            format!(
                "outcome must be 'ok', 'dropped' or 'timeout', got \"{}\"",
                outcome.chars().take(64).collect::<String>()
            ),
            "'ok': the backend served the call; 'dropped': it refused or shed it (a 429, a 503); 'timeout': the caller gave up waiting.",
        )
    })
}

/// A call's latency in microseconds from `release`'s `latency`: `None` for NULL (how long the lease was
/// held); 22023 for a negative interval or one with months.
fn latency_arg(
    function: &'static str,
    latency: Option<Interval>,
) -> Result<Option<i64>, ErrorReport> {
    let Some(latency) = latency else {
        return Ok(None);
    };
    let micros = latency.as_micros();
    if latency.months() != 0 || micros < 0 {
        return Err(error::invalid_value(
            function,
            "latency must be an interval of zero or more, without months".to_string(),
            "Pass how long the call took, e.g. interval '120 milliseconds', or leave it out (the time the lease was held).",
        ));
    }
    Ok(Some(i64::try_from(micros).unwrap_or(i64::MAX)))
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
        let namespace = limit_namespace(&named.name);
        let limit = key_limit(F, &named, &t, &namespace)?;
        let (outcome, lease) = store::acquire(
            F,
            store_of(Some(&named)),
            &t,
            random_bits(F)?,
            limit.as_ref(),
        )?;
        let mut d = combine(&[t], &[outcome]);
        d.lease = lease;
        to_row(F, &d)
    }

    /// Releases lease `lease` of `key` under the concurrency policy `policy`: true if it was held and is
    /// now free, false if it had expired or been released already. Under an adaptive policy, `outcome`
    /// ('ok', 'dropped', 'timeout') and `latency` (NULL: how long the lease was held) adapt the key's
    /// limit; a policy with fixed leases checks them and ignores them.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn release(
        policy: Option<&str>,
        key: Option<&str>,
        lease: Option<i64>,
        outcome: default!(Option<&str>, "'ok'"),
        latency: default!(Option<Interval>, "NULL"),
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
        let report = report_arg(F, outcome)?;
        let latency_us = latency_arg(F, latency)?;
        let t = with_override(&named, key, None);
        let namespace = limit_namespace(&named.name);
        let report = key_limit(F, &named, &t, &namespace)?.map(|limit| CallReport {
            limit,
            report,
            latency_us,
        });
        store::release(F, store_of(Some(&named)), &t, lease, report.as_ref())
    }
}
