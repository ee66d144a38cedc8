//! Reservations over several limits at once: `reserve_many` takes one key's estimate under several
//! policies (requests per minute, tokens per minute, tokens per day), all or nothing, and records one
//! reservation per policy under one id; `settle_many` settles each on what its policy counts. Each policy
//! weighs amounts with its own meters, so one call's amounts cost each limit what that limit counts.

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use std::rc::Rc;

use super::json_arg::JsonbText;
use super::limits::{one_store, policy_count};
use super::reservations::{
    hold_arg, reservation_arg, reserve_over, settle_over, tokens_or_amounts, TokensArgument,
    ACTUAL, ESTIMATE,
};
use super::{key_arg, policy_arg, to_row};
use crate::error;
use crate::policies::Named;

/// The policies of a call over several limits: not NULL (22004), 1 to [`rate_limit_model::target::MAX_TARGETS`] (22023), each a
/// policy ([`policy_arg`]), all in one store (0A000: all or nothing holds within one store). A policy named
/// twice is refused once its buckets are known (`targets_of`).
fn policies_arg(
    function: &'static str,
    policies: Option<Vec<Option<String>>>,
) -> Result<Vec<Rc<Named>>, ErrorReport> {
    let names = policies.ok_or_else(|| {
        error::null_argument(
            function,
            "policies",
            "Pass an array of policy names, e.g. ARRAY['requests_per_minute', 'tokens_per_minute'].",
        )
    })?;
    policy_count(function, names.len(), "reservations")?;
    let named = names
        .iter()
        .map(|n| policy_arg(function, n.as_deref()))
        .collect::<Result<Vec<Rc<Named>>, ErrorReport>>()?;
    one_store(
        function,
        &named,
        "reservation",
        "Give the policies the same store (create_policy's store argument).",
    )?;
    Ok(named)
}

/// Each policy's tokens of a call over several limits: `tokens` (one number for every policy, or one per
/// policy in their order, the argument `plural`) or `amounts` weighed by each policy's own meters,
/// exactly one of them (22004 for neither, 22023 for both); each policy's checked as
/// [`tokens_or_amounts`] checks one, its messages naming the policy.
fn tokens_of_each(
    function: &'static str,
    named: &[Rc<Named>],
    argument: &TokensArgument<'_>,
    plural: &str,
    tokens: Option<Vec<Option<i64>>>,
    amounts: Option<&JsonbText>,
) -> Result<Vec<i64>, ErrorReport> {
    match (&tokens, amounts) {
        (None, None) => return Err(error::null_argument(function, plural, argument.hint)),
        (Some(_), Some(_)) => {
            return Err(error::invalid_value(
                function,
                format!("pass {plural} or amounts, not both"),
                &format!(
                    "amounts are weighed with each policy's meters into the tokens of {plural}."
                ),
            ))
        }
        (Some(t), None) if t.len() != 1 && t.len() != named.len() => {
            return Err(error::invalid_value(
                function,
                format!(
                    "{plural} must hold one number, or one per policy ({}), got {}",
                    named.len(),
                    t.len()
                ),
                "Pass ARRAY[n] for every policy, or one number per policy in their order.",
            ))
        }
        _ => {}
    }
    named
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let value = match &tokens {
                None => None,
                Some(t) => match t[if t.len() == 1 { 0 } else { i }] {
                    Some(v) => Some(v),
                    None => return Err(error::null_argument(function, plural, argument.hint)),
                },
            };
            let name = format!("{} of policy {}", argument.name, error::quoted(&n.name));
            let labelled = TokensArgument {
                name: &name,
                ..*argument
            };
            tokens_or_amounts(function, n, &labelled, value, amounts)
        })
        .collect()
}

/// Reservations over several limits, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Reserves, for `key`, `estimates[i]` tokens under `policies[i]` (one estimate for every policy, or
    /// one per policy), all or nothing, for at most `hold`: the decision over every policy, with one
    /// reservation id in `lease` when allowed (pass it to `rate_limit.settle_many`, or to
    /// `rate_limit.settle` of one policy). `amounts` (a JSON object of whole amounts) gives the estimates
    /// instead, each policy weighing them with its own meters.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn reserve_many(
        policies: Option<Vec<Option<String>>>,
        key: Option<&str>,
        estimates: default!(Option<Vec<Option<i64>>>, "NULL"),
        hold: default!(Option<Interval>, "'00:05:00'::interval"),
        amounts: default!(Option<JsonbText>, "NULL"),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.reserve_many";
        let named = policies_arg(F, policies)?;
        let key = key_arg(F, "key", key)?;
        let estimates = tokens_of_each(
            F,
            &named,
            &ESTIMATE,
            "estimates",
            estimates,
            amounts.as_ref(),
        )?;
        let hold = hold_arg(F, hold)?;
        to_row(F, &reserve_over(F, named, key, estimates, hold)?)
    }

    /// Settles reservation `reservation` of `key` under each of `policies` on what the work used:
    /// `actuals[i]` tokens under `policies[i]` (one number for every policy, or one per policy), or
    /// `amounts` weighed by each policy's own meters; each as `rate_limit.settle` would, in the order
    /// every call locks buckets in. Returns the decision over every policy's bucket afterwards; `allowed`
    /// is true if this call settled the reservation under at least one of them, false if it changed
    /// nothing (settled already, expired, or not this key's).
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn settle_many(
        policies: Option<Vec<Option<String>>>,
        key: Option<&str>,
        reservation: Option<i64>,
        actuals: default!(Option<Vec<Option<i64>>>, "NULL"),
        amounts: default!(Option<JsonbText>, "NULL"),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.settle_many";
        let named = policies_arg(F, policies)?;
        let key = key_arg(F, "key", key)?;
        let reservation = reservation_arg(F, reservation, "rate_limit.reserve_many")?;
        let actuals = tokens_of_each(F, &named, &ACTUAL, "actuals", actuals, amounts.as_ref())?;
        to_row(F, &settle_over(F, named, key, reservation, actuals)?)
    }
}
