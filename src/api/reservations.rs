//! Reservations: `reserve` takes an estimate of a key's tokens before work whose cost is known only
//! after it (the tokens of an LLM call), `settle` gives back what was not used or charges what was used
//! beyond it, once. Any role may call both: a settle needs the reservation's id, which only the reserve
//! that made it returned, and it can never give back more than that reservation took (see
//! [`rate_limit_model::algorithm::reservation`]).

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use std::rc::Rc;

use super::family::{lock_order, with_parents};
use super::json_arg::JsonbText;
use super::leases::random_bits;
use super::limits::each_bucket_once;
use super::{combine, key_arg, policy_arg, policy_target, store_of, to_row};
use crate::decision::Decision;
use crate::error;
use crate::policies::{self, Named};
use crate::store;
use pgrx::PgSqlErrorCode;
use rate_limit_model::algorithm::{reservation_namespace, Policy};
use rate_limit_model::meters::AmountsError;
use rate_limit_model::target::{Namespace, Target};

/// The bucket of reservation or booking `name` (its namespace, [`reservation_namespace`] or
/// [`rate_limit_model::algorithm::booking_namespace`]) of the key of `target`, read with hold `hold_us`
/// (a settle does not know the hold, and need not: a reservation expires when it was made to, whatever
/// numbers it is read with).
pub(super) fn held_bucket<'a>(
    function: &'static str,
    target: &Target<'a>,
    name: &'a str,
    hold_us: i64,
) -> Result<Target<'a>, ErrorReport> {
    let policy = Policy::reservation(hold_us)
        .map_err(|e| error::bug(function, &format!("a reservation's numbers: {e}")))?;
    Ok(Target {
        namespace: Namespace::Policy {
            name,
            created_at: target.namespace.created_at(),
        },
        policy,
        changed_at: i64::MIN,
        shadow: false,
        blocking: None,
        verdict: None,
        ..*target
    })
}

/// A number of tokens these calls take: not NULL (22004), at least `least` (22023; 1 for an estimate, 0
/// for what was used). `hint` says what to pass.
pub(super) fn tokens_arg(
    function: &'static str,
    argument: &str,
    value: Option<i64>,
    least: i64,
    hint: &str,
) -> Result<i64, ErrorReport> {
    let value = value.ok_or_else(|| error::null_argument(function, argument, hint))?;
    if value < least {
        return Err(error::invalid_value(
            function,
            format!("{argument} must be {least} or more tokens, got {value}"),
            hint,
        ));
    }
    Ok(value)
}

/// What a reserve or settle calls its tokens: the argument's name, the least it may be, what to pass when
/// it is missing or too small, and what to pass when amounts weighed to too few tokens.
#[derive(Clone, Copy)]
pub(super) struct TokensArgument<'a> {
    /// The argument's name (in a message: "{name} must be …").
    pub name: &'a str,
    /// The fewest tokens it may be.
    pub least: i64,
    /// What to pass for it.
    pub hint: &'static str,
    /// What to pass when the amounts weighed to fewer than `least` tokens.
    pub weighed_hint: &'static str,
}

/// A reserve's estimate: 1 token or more.
pub(super) const ESTIMATE: TokensArgument<'static> = TokensArgument {
    name: "estimate",
    least: 1,
    hint: "Pass the tokens the work is expected to use (or amounts of the policy's meters); settle it \
           with what it used.",
    weighed_hint: "Amounts of the work expected must cost 1 or more tokens.",
};

/// What a settle's work used: 0 tokens or more.
pub(super) const ACTUAL: TokensArgument<'static> = TokensArgument {
    name: "actual",
    least: 0,
    hint: "Pass the tokens the work used (0 gives the whole reservation back), or amounts of the \
           policy's meters.",
    weighed_hint: "Pass the amounts the work used.",
};

/// The tokens of a reserve or settle, given in tokens (`tokens`, the argument `argument`) or as `amounts`
/// of the policy's weighted meters, exactly one of them: the amounts weighed ([`Meters::tokens`]), then
/// checked as tokens are ([`tokens_arg`]). 22004 for neither; 22023 for both, amounts on a policy without
/// meters, or amounts its meters do not read; 22003 for a cost beyond a bigint.
pub(super) fn tokens_or_amounts(
    function: &'static str,
    named: &Named,
    argument: &TokensArgument<'_>,
    tokens: Option<i64>,
    amounts: Option<&JsonbText>,
) -> Result<i64, ErrorReport> {
    let TokensArgument {
        name: argument,
        least,
        hint,
        weighed_hint,
    } = *argument;
    let Some(amounts) = amounts else {
        return tokens_arg(function, argument, tokens, least, hint);
    };
    if tokens.is_some() {
        return Err(error::invalid_value(
            function,
            format!("pass {argument} or amounts, not both"),
            &format!("amounts are weighed with the policy's meters into the tokens of {argument}."),
        ));
    }
    let Some(meters) = &named.row.meters else {
        return Err(error::invalid_value(
            function,
            format!("policy {} has no meters to weigh amounts with", error::quoted(&named.name)),
            &format!(
                "Give it meters with options => '{{\"meters\": {{\"input\": 0.2, \"output\": 1}}}}', \
                 or pass {argument} in tokens."
            ),
        ));
    };
    // built only for an error: a call that weighs its amounts joins no names
    let meters_hint = || {
        let known = meters.names().collect::<Vec<_>>().join(", ");
        format!("Pass a JSON object of whole amounts of the policy's meters: {known}.")
    };
    let value: serde_json::Value = serde_json::from_str(&amounts.0).map_err(|e| {
        error::invalid_value(
            function,
            format!("amounts hold a value no meter takes: {e}"),
            &meters_hint(),
        )
    })?;
    let weighed = meters.tokens(&value).map_err(|e| match e {
        AmountsError::NotAnObject(t) => error::invalid_value(
            function,
            format!("amounts must be a JSON object, got {t}"),
            &meters_hint(),
        ),
        AmountsError::Unknown(name) => error::invalid_value(
            function,
            format!(
                "policy {} has no meter {}",
                error::quoted(&named.name),
                error::quoted(&name)
            ),
            &meters_hint(),
        ),
        AmountsError::BadAmount(name, amount) => error::invalid_value(
            function,
            format!(
                "the amount of meter {} must be a whole number of 0 or more, got {amount}",
                error::quoted(&name)
            ),
            &meters_hint(),
        ),
        AmountsError::TooLarge => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            "amounts cost more than 9223372036854775807 tokens".to_string(),
            function,
        )
        .set_hint("Pass smaller amounts."),
    })?;
    tokens_arg(function, argument, Some(weighed), least, weighed_hint)
}

/// How long a reservation waits to be settled, in µs: not NULL (22004), within the bounds of a hold
/// ([`policies::hold_us`]).
pub(super) fn hold_arg(function: &'static str, hold: Option<Interval>) -> Result<i64, ErrorReport> {
    let hold = hold.ok_or_else(|| {
        error::null_argument(
            function,
            "hold",
            "Pass how long the reservation waits to be settled, e.g. interval '5 minutes'.",
        )
    })?;
    policies::hold_us(function, "hold", hold)
}

/// The id of a reservation to settle: not NULL (22004); `made_by` names the call that returned it.
pub(super) fn reservation_arg(
    function: &'static str,
    reservation: Option<i64>,
    made_by: &str,
) -> Result<i64, ErrorReport> {
    reservation.ok_or_else(|| {
        error::null_argument(
            function,
            "reservation",
            &format!("Pass the id that {made_by} returned in its lease field."),
        )
    })
}

/// A new reservation's id: 62 random bits, plus 1 (positive, never 0).
pub(super) fn new_reservation_id(function: &'static str) -> Result<i64, ErrorReport> {
    Ok(i64::try_from(random_bits(function)? >> 2).unwrap_or(0) + 1)
}

/// The buckets of `key` under each of `named`, each once (22023).
fn targets_of<'a>(
    function: &'static str,
    named: &'a [Rc<Named>],
    key: &'a str,
) -> Result<Vec<Target<'a>>, ErrorReport> {
    let targets = named
        .iter()
        .map(|n| policy_target(function, n, key))
        .collect::<Result<Vec<Target<'_>>, ErrorReport>>()?;
    each_bucket_once(function, &targets)?;
    Ok(targets)
}

/// Reserves `estimates[i]` tokens of `key` under `named[i]` (every policy in one store), and each child's
/// estimate under its parent too, all or nothing, for `hold_us`: the decision over every bucket, with the
/// reservation's id in `lease` when recorded. The body of `reserve_many`, and of `reserve` on a child.
pub(super) fn reserve_over(
    function: &'static str,
    named: Vec<Rc<Named>>,
    key: &str,
    estimates: Vec<i64>,
    hold_us: i64,
) -> Result<Decision, ErrorReport> {
    let (named, estimates) = with_parents(function, named, estimates)?;
    let targets = targets_of(function, &named, key)?;
    let id = new_reservation_id(function)?;
    let names: Vec<String> = named
        .iter()
        .map(|n| reservation_namespace(&n.name, id))
        .collect();
    let held = targets
        .iter()
        .zip(&names)
        .map(|(t, name)| held_bucket(function, t, name, hold_us))
        .collect::<Result<Vec<Target<'_>>, ErrorReport>>()?;
    let store = store_of(Some(&named[0]));
    let (outcomes, recorded) = store::reserve_many(function, store, &targets, &held, &estimates)?;
    let mut d = combine(&targets, &outcomes);
    d.lease = recorded.then_some(id);
    Ok(d)
}

/// Settles reservation `reservation` of `key` under each of `named` on `actuals[i]` tokens (and each
/// child's under its parent too), every reservation first and then every key's bucket, in the lock
/// order: the decision over every bucket afterwards, `allowed` when this call settled the reservation
/// under at least one of them. The body of `settle_many`, and of `settle` on a child.
pub(super) fn settle_over(
    function: &'static str,
    named: Vec<Rc<Named>>,
    key: &str,
    reservation: i64,
    actuals: Vec<i64>,
) -> Result<Decision, ErrorReport> {
    let (named, actuals) = with_parents(function, named, actuals)?;
    let targets = targets_of(function, &named, key)?;
    let store = store_of(Some(&named[0]));
    let order = lock_order(&targets);
    let names: Vec<String> = order
        .iter()
        .map(|&i| reservation_namespace(&named[i].name, reservation))
        .collect();
    let held = order
        .iter()
        .zip(&names)
        .map(|(&i, name)| held_bucket(function, &targets[i], name, 1))
        .collect::<Result<Vec<Target<'_>>, ErrorReport>>()?;
    let ordered: Vec<Target<'_>> = order.iter().map(|&i| targets[i]).collect();
    let actuals: Vec<i64> = order.iter().map(|&i| actuals[i]).collect();
    let max_debts: Vec<i64> = order.iter().map(|&i| named[i].max_debt).collect();
    let settled = store::settle_many(function, store, &ordered, &held, &actuals, &max_debts)?;
    let mut outcomes = vec![settled[0].0; targets.len()];
    for (&i, (outcome, _)) in order.iter().zip(&settled) {
        outcomes[i] = *outcome;
    }
    let settled_any = settled.iter().any(|(_, done)| *done);
    let mut d = combine(&targets, &outcomes);
    d.allowed = settled_any;
    d.lease = settled_any.then_some(reservation);
    Ok(d)
}

/// Reservations of tokens, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Reserves `estimate` tokens of `key` under `policy`, as `rate_limit.take` would take them, for at most
    /// `hold`: the decision, with the reservation's id in `lease` when allowed (pass it to
    /// `rate_limit.settle` with what the work used). A reservation not settled within `hold` is settled at
    /// its estimate. In the table store a reservation made in a transaction that rolls back is undone.
    /// `amounts` (a JSON object of the policy's meters and whole amounts) gives the estimate instead, weighed
    /// by the policy's meters.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn reserve(
        policy: Option<&str>,
        key: Option<&str>,
        estimate: default!(Option<i64>, "NULL"),
        hold: default!(Option<Interval>, "'00:05:00'::interval"),
        amounts: default!(Option<JsonbText>, "NULL"),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.reserve";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let estimate = tokens_or_amounts(F, &named, &ESTIMATE, estimate, amounts.as_ref())?;
        let hold = hold_arg(F, hold)?;
        if named.row.parent.is_some() {
            return to_row(F, &reserve_over(F, vec![named], key, vec![estimate], hold)?);
        }
        let t = policy_target(F, &named, key)?;
        let id = new_reservation_id(F)?;
        let name = reservation_namespace(&named.name, id);
        let r = held_bucket(F, &t, &name, hold)?;
        let (outcome, recorded) = store::reserve(F, store_of(Some(&named)), &t, &r, estimate)?;
        let mut d = combine(&[t], &[outcome]);
        d.lease = recorded.then_some(id);
        to_row(F, &d)
    }

    /// Settles reservation `reservation` of `key` under `policy` on `actual` tokens used: what was reserved
    /// and not used goes back into the key's bucket, what was used beyond it is charged, down to the
    /// policy's `max_debt` below zero. Returns the key's bucket afterwards; `allowed` is true if this call
    /// settled the reservation, false if it was settled already, had expired (settled at its estimate) or
    /// is not this key's, and nothing changed. `amounts` (a JSON object of the policy's meters and whole
    /// amounts) gives what was used instead, weighed by the policy's meters.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn settle(
        policy: Option<&str>,
        key: Option<&str>,
        reservation: Option<i64>,
        actual: default!(Option<i64>, "NULL"),
        amounts: default!(Option<JsonbText>, "NULL"),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.settle";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let reservation = reservation_arg(F, reservation, "rate_limit.reserve")?;
        let actual = tokens_or_amounts(F, &named, &ACTUAL, actual, amounts.as_ref())?;
        if named.row.parent.is_some() {
            return to_row(
                F,
                &settle_over(F, vec![named], key, reservation, vec![actual])?,
            );
        }
        let t = policy_target(F, &named, key)?;
        let name = reservation_namespace(&named.name, reservation);
        let r = held_bucket(F, &t, &name, 1)?;
        let store = store_of(Some(&named));
        let (outcome, settled) = store::settle(F, store, &t, &r, actual, named.max_debt)?;
        let mut d = combine(&[t], &[outcome]);
        d.allowed = settled;
        d.lease = settled.then_some(reservation);
        to_row(F, &d)
    }
}
