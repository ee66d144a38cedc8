//! `rate_limiting_request(id, refill_per_sec, window_seconds)` and the functions over its buckets.
//!
//! It is exactly the token bucket of the one model (rate `refill_per_sec` per second, burst
//! `refill_per_sec × window_seconds`, cost 1) in its own namespace: the same arithmetic, the same store
//! code and state table, the same fast paths as every other call. Its contract: the whole tokens left
//! after the call, or -1 when denied.

use pgrx::datum::AnyNumeric;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::error;
use crate::gucs;
use crate::store;
use rate_limit_model::algorithm::token_bucket::{Limit, MICROS_PER_SECOND};
use rate_limit_model::algorithm::{Algorithm, Outcome, Policy};
use rate_limit_model::target::{Namespace, Target};

/// The largest capacity whose remaining count (`capacity - 1`) fits in the `int` a request returns.
const MAX_CAPACITY: i64 = i32::MAX as i64 + 1;

fn positive_int_arg(
    function: &'static str,
    name: &str,
    value: Option<i32>,
    default: i32,
) -> Result<i64, ErrorReport> {
    let value = value.ok_or_else(|| {
        error::null_argument(
            function,
            name,
            &format!(
                "Pass a whole number from 1 to {}, or omit {name} for its default of {default}.",
                i32::MAX
            ),
        )
    })?;
    if value < 1 {
        return Err(error::out_of_range(
            function,
            name,
            value.into(),
            1,
            i32::MAX.into(),
        ));
    }
    Ok(value.into())
}

/// The token bucket of `rate_limiting_request(id, refill_per_sec, window_seconds)`, validated.
fn request_policy(
    function: &'static str,
    refill_per_sec: Option<i32>,
    window_seconds: Option<i32>,
) -> Result<Policy, ErrorReport> {
    let refill = positive_int_arg(function, "refill_per_sec", refill_per_sec, 2)?;
    let window = positive_int_arg(function, "window_seconds", window_seconds, 60)?;
    // Both are at most i32::MAX, so the product fits in i64.
    let capacity = refill * window;
    if capacity > MAX_CAPACITY {
        return Err(error::capacity_too_large(
            function,
            capacity.into(),
            MAX_CAPACITY,
        ));
    }
    let limit = Limit::per_second(refill, window)
        .map_err(|e| error::out_of_range_limit(function, &e.to_string()))?;
    Policy::new(
        Algorithm::TokenBucket,
        limit.rate(),
        MICROS_PER_SECOND,
        limit.burst(),
    )
    .map_err(|e| error::out_of_range_limit(function, &e.to_string()))
}

/// The bucket of `id` in `rate_limiting_request`'s namespace under the given numbers.
fn request_target(id: &str, policy: Policy) -> Target<'_> {
    Target {
        namespace: Namespace::Request,
        key: id,
        policy,
        changed_at: i64::MIN,
        shadow: gucs::shadow(),
        blocking: None,
        verdict: None,
    }
}

/// Asks the bucket of `id` for `cost` tokens (0 only reports) in the session's store.
fn request(
    function: &'static str,
    id: Option<&str>,
    refill_per_sec: Option<i32>,
    window_seconds: Option<i32>,
    cost: i64,
) -> Result<(Outcome, Policy), ErrorReport> {
    let id = crate::api::key_arg(function, "id", id)?;
    let policy = request_policy(function, refill_per_sec, window_seconds)?;
    crate::bounds::caller_limit(function, &policy, cost)?;
    let target = request_target(id, policy);
    let outcomes = store::take(function, gucs::store(), &[target], cost)?;
    let outcome = outcomes
        .first()
        .copied()
        .ok_or_else(|| error::bug(function, "the store returned no outcome for one bucket"))?;
    Ok((outcome, policy))
}

/// Takes one token from the bucket `id`, refilled at `refill_per_sec` tokens per second up to
/// `refill_per_sec × window_seconds` tokens; returns the whole tokens left, or -1 when denied. Under
/// `rate_limit.shadow` nothing is denied: a would-be denial returns 0 (and is counted).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rate_limiting_request(
    id: Option<&str>,
    refill_per_sec: default!(Option<i32>, 2),
    window_seconds: default!(Option<i32>, 60),
) -> Result<i32, ErrorReport> {
    let (outcome, _) = request(
        "rate_limiting_request",
        id,
        refill_per_sec,
        window_seconds,
        1,
    )?;
    if outcome.allowed || gucs::shadow() {
        // remaining <= capacity - 1 <= i32::MAX, checked by request_policy
        Ok(i32::try_from(outcome.remaining).unwrap_or(i32::MAX))
    } else {
        Ok(-1)
    }
}

/// The functions over `rate_limiting_request`'s buckets, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Whole tokens in the bucket `id` now under the given limit, taking none and writing nothing.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn peek_request(
        id: Option<&str>,
        refill_per_sec: default!(Option<i32>, 2),
        window_seconds: default!(Option<i32>, 60),
    ) -> Result<i64, ErrorReport> {
        let (outcome, _) = request(
            "rate_limit.peek_request",
            id,
            refill_per_sec,
            window_seconds,
            0,
        )?;
        Ok(outcome.remaining)
    }

    /// Tokens in the bucket `id` now under the given limit, exact to the millionth; takes none.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn tokens(
        id: Option<&str>,
        refill_per_sec: default!(Option<i32>, 2),
        window_seconds: default!(Option<i32>, 60),
    ) -> Result<AnyNumeric, ErrorReport> {
        const F: &str = "rate_limit.tokens";
        let (outcome, policy) = request(F, id, refill_per_sec, window_seconds, 0)?;
        let state = outcome.state;
        error::millionths_numeric(F, policy.tokens_millionths(state, state.at))
    }

    /// Deletes the bucket `id` of `rate_limiting_request`, which makes it full again; true if it existed.
    /// Owner only.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn reset_request(id: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.reset_request";
        let id = crate::api::key_arg(F, "id", id)?;
        store::reset(F, gucs::store(), &Namespace::Request, id)
    }

    /// Deletes every bucket (of every namespace, in both stores) that is full now, losslessly: a missing
    /// bucket is a full one. Returns how many. Owner only.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn purge() -> Result<i64, ErrorReport> {
        store::purge("rate_limit.purge")
    }
}
