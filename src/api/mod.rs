//! The SQL surface: thin functions that validate their arguments, call the store seam and shape the result.
//!
//! - `request`: `rate_limiting_request` and the functions over its buckets;
//! - `limits`: the limiter API over named policies and ad-hoc limits (`take`, `take_many`,
//!   `take_ad_hoc`, `peek`, `wait`, `refund`, `reset`, `headers`);
//! - `allow`: `allow`, take's answer as a boolean, run as its owner without being SECURITY DEFINER;
//! - `batch`: `take_batch`, decisions for many keys of one policy in one statement;
//! - `leases`: `acquire` and `release` of concurrency policies;
//! - `reservations`: `reserve` and `settle`, tokens taken on an estimate and settled on what was used;
//! - `blocks`: `block` and `unblock`, blocks by hand (owner only);
//! - `policies`: creating, changing and dropping policies (owner only); `json_arg` reads their `options`
//!   (a `jsonb`) as text, for the policies module to check;
//! - `overrides`: `set_override` and `clear_override`, per-key overrides of a policy (owner only);
//! - `triggers`: `limit_writes`, the row trigger that limits writes per key; `trigger_call` refuses
//!   direct calls of trigger functions with 39P01;
//! - `stats`: the statistics views' functions and their reset (owner only);
//! - `metrics`: the monitoring views' functions (owner and `pg_monitor`);
//! - `nodes_of`: under Citus, the node that holds each key;
//! - `purge_idle`: the span function of `rate_limit.purge_idle()`, the purge for pg_cron;
//! - `internal`: the memory store's reports and what the extension's views read (`memory_buckets`
//!   and `memory_shares` are the owner's; `memory_usage`, sizes and counts only, is open to every role);
//! - `materialized`: handing many rows of a set-returning function to the executor at once.
//!
//! No function carries a `SET` clause: the statements they run name every object and operator with its
//! schema. No two public functions of one name accept the same number of arguments, so drivers that send
//! parameters untyped (node-postgres, asyncpg) can call each of them.

pub mod allow;
pub mod batch;
pub mod blocks;
pub mod bookings;
pub mod family;
pub mod internal;
pub mod json_arg;
pub mod leases;
pub mod limits;
pub mod materialized;
pub mod metrics;
pub mod nodes_of;
pub mod overrides;
pub mod policies;
pub mod purge_idle;
pub mod request;
pub mod reservations;
pub mod reservations_many;
pub mod stats;
pub mod trigger_call;
pub mod triggers;

use std::rc::Rc;

use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::AllocatedByRust;

use crate::decision::{self, Decision, Reported};
use crate::error::{self, MAX_ID_BYTES};
use crate::gucs::{self, Store};
use crate::policies::overrides::{in_effect, Effect, Override};
use crate::policies::{self as named_policies, Named};
use crate::store;
use crate::time::clock;
use rate_limit_model::algorithm::{Algorithm, Outcome};
use rate_limit_model::target::{Namespace, Target};

/// The SQL type every limiter call returns.
pub type DecisionRow = PgHeapTuple<'static, AllocatedByRust>;

/// A key argument: not NULL, at most [`MAX_ID_BYTES`] bytes. `argument` names it in errors.
pub fn key_arg<'a>(
    function: &'static str,
    argument: &str,
    key: Option<&'a str>,
) -> Result<&'a str, ErrorReport> {
    let key = key.ok_or_else(|| {
        error::null_argument(
            function,
            argument,
            "Pass the key to limit, such as a user id, an API key or an IP address.",
        )
    })?;
    if key.len() > MAX_ID_BYTES {
        return Err(error::key_too_long(function, argument, key.len()));
    }
    Ok(key)
}

/// The policy named by an argument, from the coherent policy cache (42704 if there is none), for a call
/// that takes tokens (42809 for a concurrency policy, whose buckets are lease slots).
pub fn policy_arg(function: &'static str, name: Option<&str>) -> Result<Rc<Named>, ErrorReport> {
    let named = any_policy_arg(function, name)?;
    if named.policy.algorithm() == Algorithm::Concurrency {
        return Err(named_policies::wrong_kind(function, &named));
    }
    Ok(named)
}

/// The concurrency policy named by an argument (42704 if there is none, 42809 for another kind).
pub fn lease_policy_arg(
    function: &'static str,
    name: Option<&str>,
) -> Result<Rc<Named>, ErrorReport> {
    let named = any_policy_arg(function, name)?;
    if named.policy.algorithm() != Algorithm::Concurrency {
        return Err(named_policies::wrong_kind(function, &named));
    }
    Ok(named)
}

/// The policy named by an argument, of any kind (42704 if there is none).
pub fn any_policy_arg(
    function: &'static str,
    name: Option<&str>,
) -> Result<Rc<Named>, ErrorReport> {
    let name = name.ok_or_else(|| {
        error::null_argument(
            function,
            "policy",
            "Pass the name of a policy from rate_limit.policies.",
        )
    })?;
    named_policies::get(function, name)
}

/// The bucket of `key` under a named policy, with the key's override if the policy has any (one
/// primary-key read, [`named_policies::overrides::of_key`]; a policy without overrides reads nothing).
pub fn policy_target<'a>(
    function: &'static str,
    named: &'a Named,
    key: &'a str,
) -> Result<Target<'a>, ErrorReport> {
    let override_of_key = if named_policies::overrides::any(function, named)? {
        named_policies::overrides::of_key(function, named, key)?
    } else {
        None
    };
    Ok(with_override(named, key, override_of_key.as_ref()))
}

/// The bucket of `key` under a named policy, given the key's override (`None`: it has none).
pub fn with_override<'a>(named: &'a Named, key: &'a str, o: Option<&Override>) -> Target<'a> {
    let mut target = Target {
        namespace: Namespace::Policy {
            name: &named.name,
            created_at: named.created_at,
        },
        key,
        policy: named.policy,
        changed_at: named.changed_at,
        shadow: named.shadow || gucs::shadow(),
        blocking: Some(named.blocking),
        verdict: None,
    };
    if let Some(o) = o {
        match in_effect(named, o, clock::now_us()) {
            Effect::Limit { policy, changed_at } => {
                target.policy = policy;
                target.changed_at = changed_at;
            }
            Effect::Fixed(verdict) => target.verdict = Some(verdict),
        }
    }
    target
}

/// Where a policy's buckets live: its own store, else the session's `rate_limit.store`.
pub fn store_of(named: Option<&Named>) -> Store {
    named.and_then(|n| n.store).unwrap_or_else(gucs::store)
}

/// Runs `targets` (all in `store`) for `cost` tokens, all or nothing, and combines the outcomes.
pub fn decide(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<Decision, ErrorReport> {
    take_answered(function, store, targets, cost, combine)
}

/// Runs `targets` (all in `store`) for `cost` tokens, all or nothing, answered by `answer` from the
/// targets and their outcomes: the decision ([`combine`], see [`decide`]), or less.
pub fn take_answered<R>(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    cost: i64,
    answer: impl FnOnce(&[Target<'_>], &[Outcome]) -> R,
) -> Result<R, ErrorReport> {
    let outcomes = store::take(function, store, targets, cost)?;
    Ok(answer(targets, &outcomes))
}

/// The decision of `outcomes` (`outcomes[i]` is `targets[i]`'s).
pub fn combine(targets: &[Target<'_>], outcomes: &[Outcome]) -> Decision {
    let buckets: Vec<Reported<'_>> = targets
        .iter()
        .map(|t| Reported {
            name: t.namespace.policy_name(),
            limit: t.policy.burst(),
            shadow: t.shadow,
        })
        .collect();
    Decision::combine(&buckets, outcomes)
}

/// The decision as a `rate_limit.decision` value.
pub fn to_row(function: &'static str, d: &Decision) -> Result<DecisionRow, ErrorReport> {
    decision::to_sql(function, d)
}
