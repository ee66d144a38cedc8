//! The limiter API over named policies and ad-hoc limits: `take` (and, for [`super::allow`], its answer as
//! a boolean), `take_many`, `take_ad_hoc`, `peek`, `wait`, `charge`, `refund`, `reset`, `reset_ad_hoc`,
//! and `headers` for HTTP responses. Each name has one signature, so drivers that send parameters untyped
//! can call every one of them.

use pgrx::datum::{Interval, JsonB};
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use super::family::{family_targets, in_lock_order, parent_of, with_parents};
use super::{
    combine, decide, key_arg, policy_arg, policy_target, store_of, take_answered, to_row,
    with_override,
};
use crate::decision::Decision;
use crate::error;
use crate::gucs::{self, Store};
use crate::policies;
use crate::policies::Named;
use crate::store;
use crate::time::clock;
use rate_limit_model::algorithm::{Algorithm, Outcome};
use rate_limit_model::target::{Namespace, Target, MAX_TARGETS};
use std::rc::Rc;

use super::policies::build_policy;

fn cost_arg(function: &'static str, cost: Option<i32>) -> Result<i64, ErrorReport> {
    let cost = cost.ok_or_else(|| {
        error::null_argument(
            function,
            "cost",
            "Pass the tokens to take (0 only reports), or omit cost for 1.",
        )
    })?;
    if cost < 0 {
        return Err(error::out_of_range(
            function,
            "cost",
            cost.into(),
            0,
            i32::MAX.into(),
        ));
    }
    Ok(cost.into())
}

/// `take(policy, key, cost)` as a plain decision (also the body of `peek` and `wait`).
pub(super) fn take_policy(
    function: &'static str,
    policy: Option<&str>,
    key: Option<&str>,
    cost: Option<i32>,
) -> Result<Decision, ErrorReport> {
    take_policy_answer(function, policy, key, cost, combine)
}

/// `take(policy, key, cost)`, answered by `answer` from its one target and outcome: the decision
/// ([`combine`]), or only whether it was granted (`granted`, [`super::allow`]).
pub(super) fn take_policy_answer<R>(
    function: &'static str,
    policy: Option<&str>,
    key: Option<&str>,
    cost: Option<i32>,
    answer: impl FnOnce(&[Target<'_>], &[Outcome]) -> R,
) -> Result<R, ErrorReport> {
    let named = policy_arg(function, policy)?;
    let key = key_arg(function, "key", key)?;
    let cost = cost_arg(function, cost)?;
    let parent = parent_of(function, &named)?;
    let targets = family_targets(function, &named, parent.as_deref(), key)?;
    take_answered(function, store_of(Some(&named)), &targets, cost, answer)
}

/// 22023 when two targets name the same bucket.
pub(super) fn each_bucket_once(
    function: &'static str,
    targets: &[Target<'_>],
) -> Result<(), ErrorReport> {
    for (i, t) in targets.iter().enumerate() {
        if targets[..i].iter().any(|o| o.same_bucket(t)) {
            return Err(error::invalid_value(
                function,
                format!(
                    "policy {} is named twice for key {}",
                    error::quoted(t.namespace.stored_name()),
                    error::quoted(t.key)
                ),
                "Name each (policy, key) once (a call on a child also takes from its parent's bucket); \
                 pass a higher cost to take more tokens.",
            ));
        }
    }
    Ok(())
}

/// Several (policy, key) pairs, validated: 1 to [`MAX_TARGETS`] policies, one key for all or one per
/// policy, no NULLs, no pair twice, one store.
fn take_pairs(
    function: &'static str,
    policies: Option<Vec<Option<String>>>,
    keys: Option<Vec<Option<String>>>,
    cost: Option<i32>,
) -> Result<Decision, ErrorReport> {
    let names = policies.ok_or_else(|| {
        error::null_argument(
            function,
            "policies",
            "Pass an array of policy names, e.g. ARRAY['per_user', 'global'].",
        )
    })?;
    let keys = keys.ok_or_else(|| {
        error::null_argument(
            function,
            "keys",
            "Pass one key for every policy, e.g. ARRAY[user_id], or one key per policy.",
        )
    })?;
    let cost = cost_arg(function, cost)?;
    policy_count(function, names.len(), "calls")?;
    if keys.len() != 1 && keys.len() != names.len() {
        return Err(error::invalid_value(
            function,
            format!(
                "keys must hold one key, or one key per policy ({}), got {}",
                names.len(),
                keys.len()
            ),
            "Pass ARRAY[key] to use one key for every policy, or one key per policy in the same order.",
        ));
    }
    let mut named = Vec::with_capacity(names.len());
    for n in &names {
        named.push(policy_arg(function, n.as_deref())?);
    }
    let mut valid_keys = Vec::with_capacity(keys.len());
    for k in &keys {
        valid_keys.push(key_arg(function, "keys", k.as_deref())?);
    }
    // each policy's key, then each child's key again for its parent
    let mut keys_of: Vec<usize> = (0..named.len())
        .map(|i| if valid_keys.len() == 1 { 0 } else { i })
        .collect();
    let children: Vec<usize> = (0..named.len())
        .filter(|&i| named[i].row.parent.is_some())
        .collect();
    let parents_keys: Vec<usize> = children.iter().map(|&i| keys_of[i]).collect();
    keys_of.extend(parents_keys);
    let (named, _) = with_parents(function, named, vec![0; names.len()])?;
    let targets = named
        .iter()
        .zip(&keys_of)
        .map(|(n, &k)| policy_target(function, n, valid_keys[k]))
        .collect::<Result<Vec<Target<'_>>, ErrorReport>>()?;
    each_bucket_once(function, &targets)?;
    let store = one_store(
        function,
        &named,
        "call",
        "Give the policies the same store (create_policy's store argument), or call take twice.",
    )?;
    decide(function, store, &targets, cost)
}

/// 22023 unless `count` policies are 1 to [`MAX_TARGETS`], the most one call or reservation spans; the
/// hint suggests splitting them over several `calls` ("calls", "reservations").
pub(super) fn policy_count(
    function: &'static str,
    count: usize,
    calls: &str,
) -> Result<(), ErrorReport> {
    if count == 0 || count > MAX_TARGETS {
        return Err(error::invalid_value(
            function,
            format!("policies must name 1 to {MAX_TARGETS} policies, got {count}"),
            &format!("Split the limits over several {calls}, or combine them in fewer policies."),
        ));
    }
    Ok(())
}

/// The store of every policy of `named` (at least one), the policies of one `call` (a call, a
/// reservation); 0A000 when they keep their buckets in different stores, with `hint`: all or nothing
/// holds within one store only.
pub(super) fn one_store(
    function: &'static str,
    named: &[Rc<Named>],
    call: &str,
    hint: &str,
) -> Result<Store, ErrorReport> {
    let store = store_of(named.first().map(|n| &**n));
    if named.iter().any(|n| store_of(Some(n)) != store) {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("the policies of one {call} must keep their buckets in the same store"),
            function,
        )
        .set_detail("All-or-nothing consumption is atomic within one store only.")
        .set_hint(hint));
    }
    Ok(store)
}

/// Calls of the full limiter API, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Takes `cost` tokens (0 only reports) from the bucket of `key` under policy `policy`.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn take(
        policy: Option<&str>,
        key: Option<&str>,
        cost: default!(Option<i32>, 1),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.take";
        to_row(F, &take_policy(F, policy, key, cost)?)
    }

    /// Takes `cost` tokens from the bucket of `key` under an ad-hoc limit: `rate` tokens per `per`, at most
    /// `burst` (default: `rate`), token bucket. Ad-hoc buckets share one namespace, apart from policies'.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn take_ad_hoc(
        key: Option<&str>,
        rate: Option<i64>,
        per: Option<Interval>,
        burst: default!(Option<i64>, "NULL"),
        cost: default!(Option<i32>, 1),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.take_ad_hoc";
        let key = key_arg(F, "key", key)?;
        let rate = rate.ok_or_else(|| {
            error::null_argument(F, "rate", "Pass the tokens granted per period, e.g. 100.")
        })?;
        let per = per.ok_or_else(|| {
            error::null_argument(F, "per", "Pass the period, e.g. interval '1 minute'.")
        })?;
        let cost = cost_arg(F, cost)?;
        let policy = build_policy(F, Algorithm::TokenBucket, rate, per, burst)?;
        crate::bounds::caller_limit(F, &policy, cost)?;
        let t = Target {
            namespace: Namespace::AdHoc,
            key,
            policy,
            changed_at: i64::MIN,
            shadow: gucs::shadow(),
            blocking: None,
            verdict: None,
        };
        to_row(F, &decide(F, store_of(None), &[t], cost)?)
    }

    /// Takes `cost` tokens under every policy in `policies`, or nothing at all: from the bucket of
    /// `keys[1]` under every policy when `keys` holds one key, else from `keys[i]` under `policies[i]`
    /// (per-user, per-organisation and global limits in one atomic call).
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn take_many(
        policies: Option<Vec<Option<String>>>,
        keys: Option<Vec<Option<String>>>,
        cost: default!(Option<i32>, 1),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.take_many";
        to_row(F, &take_pairs(F, policies, keys, cost)?)
    }

    /// The bucket of `key` under policy `policy`, without taking anything.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn peek(
        policy: Option<&str>,
        key: Option<&str>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.peek";
        to_row(F, &take_policy(F, policy, key, Some(0))?)
    }

    /// Waits on the backend's latch until `cost` tokens can be taken, takes them and returns the decision;
    /// gives up, taking nothing, when they cannot be had within `timeout` (NULL: `rate_limit.max_wait`,
    /// which also bounds any timeout given). While it sleeps the call holds its statement's snapshot and,
    /// with the table store, the lock of its first take on the state table, as every statement does until
    /// it ends: `rate_limit.max_wait` bounds both, per statement: however many waits one statement chains
    /// (a join, a PL/pgSQL loop), none sleeps past `max_wait` after the statement (or, in a procedure
    /// that commits, its current transaction) started. Query cancel and `statement_timeout` interrupt it.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn wait(
        policy: Option<&str>,
        key: Option<&str>,
        cost: default!(Option<i32>, 1),
        timeout: default!(Option<Interval>, "NULL"),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.wait";
        let max_us = gucs::max_wait_us();
        let timeout_us = match timeout {
            None => max_us,
            Some(t) => {
                if t.months() != 0 || t.as_micros() < 0 {
                    return Err(ErrorReport::new(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        "timeout must be zero or a positive interval without months",
                        F,
                    )
                    .set_hint(
                        "Pass e.g. interval '5 seconds', or NULL to wait up to rate_limit.max_wait.",
                    ));
                }
                let us = i64::try_from(t.as_micros()).unwrap_or(i64::MAX);
                if us > max_us {
                    return Err(ErrorReport::new(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        format!(
                            "timeout must be at most rate_limit.max_wait ({} ms), got {} ms",
                            max_us / 1000,
                            us.saturating_add(999) / 1000
                        ),
                        F,
                    )
                    .set_detail("A waiting call holds its statement's snapshot while it sleeps.")
                    .set_hint(
                        "Pass a shorter timeout, or NULL for rate_limit.max_wait; a superuser sets \
                         rate_limit.max_wait.",
                    ));
                }
                us
            }
        };
        let deadline = crate::bounds::wait_deadline(timeout_us);
        loop {
            let d = take_policy(F, policy, key, cost)?;
            let Some(retry) = d.retry_after.filter(|_| !d.allowed) else {
                return to_row(F, &d); // granted, or can never be
            };
            let now = clock::now_us();
            if now.saturating_add(retry) > deadline {
                return to_row(F, &d); // not within the timeout: give up now, like Go's Limiter.Wait
            }
            sleep_us(retry);
        }
    }

    /// Puts up to `tokens` back into the bucket of `key` under `policy` (never above its burst) and returns
    /// the bucket afterwards. Owner only (GRANT EXECUTE to delegate).
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn refund(
        policy: Option<&str>,
        key: Option<&str>,
        tokens: Option<i64>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.refund";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let tokens = tokens.ok_or_else(|| {
            error::null_argument(F, "tokens", "Pass the number of tokens to give back.")
        })?;
        if tokens < 0 {
            return Err(error::out_of_range(F, "tokens", tokens, 0, i64::MAX));
        }
        let parent = parent_of(F, &named)?;
        let targets = family_targets(F, &named, parent.as_deref(), key)?;
        let store = store_of(Some(&named));
        let outcomes = in_lock_order(&targets, |_, t| store::refund(F, store, t, tokens))?;
        to_row(F, &crate::api::combine(&targets, &outcomes))
    }

    /// Charges `cost` tokens to the bucket of `key` under `policy` after the fact: always taken, down to
    /// the policy's `max_debt` tokens below zero (beyond that the cost is forgiven); while the bucket is in
    /// debt, takes are denied. Returns the bucket afterwards (allowed; `remaining` 0 while in debt).
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn charge(
        policy: Option<&str>,
        key: Option<&str>,
        cost: Option<i64>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.charge";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let cost = cost.ok_or_else(|| {
            error::null_argument(
                F,
                "cost",
                "Pass the tokens the work used (or what it used beyond the estimate taken before it).",
            )
        })?;
        if cost < 0 {
            return Err(error::out_of_range(F, "cost", cost, 0, i64::MAX)
                .set_hint("To give tokens back, use rate_limit.refund."));
        }
        let parent = parent_of(F, &named)?;
        let targets = family_targets(F, &named, parent.as_deref(), key)?;
        let store = store_of(Some(&named));
        // each bucket down to its own policy's max_debt, in the lock order of every call
        let debts = [Some(named.max_debt), parent.as_ref().map(|p| p.max_debt)];
        let debts: Vec<i64> = debts.into_iter().flatten().collect();
        let outcomes = in_lock_order(&targets, |i, t| store::charge(F, store, t, cost, debts[i]))?;
        to_row(F, &crate::api::combine(&targets, &outcomes))
    }

    /// Deletes the bucket of `key` under `policy` (it is full again); true if it existed. Owner only.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn reset(policy: Option<&str>, key: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.reset";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let t = with_override(&named, key, None);
        store::reset(F, store_of(Some(&named)), &t.namespace, key)
    }

    /// Deletes the ad-hoc bucket of `key` in the session's store (it is full again); true if it existed.
    /// Owner only.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn reset_ad_hoc(key: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.reset_ad_hoc";
        let key = key_arg(F, "key", key)?;
        store::reset(F, store_of(None), &Namespace::AdHoc, key)
    }

    /// The HTTP response fields for a decision, per the IETF RateLimit header fields draft: `RateLimit`,
    /// `RateLimit-Policy` (when the decision names its policy) and, when denied, `Retry-After`. `policy`
    /// is only the name printed (a label, e.g. for ad-hoc decisions): the numbers are always those of the
    /// decision's own policy, never of a policy the label happens to name.
    #[pg_extern(stable, parallel_safe)]
    fn headers(
        decision: Option<pgrx::composite_type!("rate_limit.decision")>,
        policy: default!(Option<&str>, "NULL"),
    ) -> Result<JsonB, ErrorReport> {
        const F: &str = "rate_limit.headers";
        let d = decision.ok_or_else(|| {
            error::null_argument(
                F,
                "decision",
                "Pass the decision of a call, e.g. SELECT rate_limit.headers(d) FROM rate_limit.take('api', 'alice') AS d.",
            )
        })?;
        let allowed: Option<bool> = field(F, &d, "allowed")?;
        let remaining: Option<i64> = field(F, &d, "remaining")?;
        let limit: Option<i64> = field(F, &d, "limit")?;
        let retry: Option<Interval> = field(F, &d, "retry_after")?;
        let reset: Option<Interval> = field(F, &d, "reset_after")?;
        let (allowed, remaining, reset) =
            decision_numbers(F, allowed, remaining, limit, retry, reset)?;
        let decided_by: Option<String> = field(F, &d, "policy")?;
        let numbers = match decided_by.as_deref() {
            Some(n) => Some(policies::get(F, n)?.policy),
            None => None,
        };
        let fields = rate_limit_model::http::fields(&rate_limit_model::http::Input {
            name: policy.or(decided_by.as_deref()),
            allowed,
            remaining,
            limit,
            retry_after_us: retry.map(|i| i.as_micros()),
            reset_after_us: reset,
            policy: numbers,
        });
        Ok(JsonB(fields))
    }
}

/// The numbers of a decision given to `headers`, as a call returns them: `allowed`, `remaining` and
/// `reset_after` present (22004 otherwise: a decision with no answer must not print headers that a
/// client could read as one), and nothing negative (22023: no call reports a negative count or time).
/// Returns (allowed, remaining, reset_after in µs).
fn decision_numbers(
    function: &'static str,
    allowed: Option<bool>,
    remaining: Option<i64>,
    limit: Option<i64>,
    retry: Option<Interval>,
    reset: Option<Interval>,
) -> Result<(bool, i64, i128), ErrorReport> {
    let hint = "Pass the decision a call returned, e.g. SELECT rate_limit.headers(d) FROM rate_limit.take('api', 'alice') AS d.";
    let (Some(allowed), Some(remaining), Some(reset)) = (allowed, remaining, reset) else {
        let missing = match (allowed, remaining) {
            (None, _) => "decision.allowed",
            (_, None) => "decision.remaining",
            _ => "decision.reset_after",
        };
        return Err(error::null_argument(function, missing, hint));
    };
    let negative = [
        ("remaining", remaining < 0),
        ("limit", limit.is_some_and(|l| l < 0)),
        ("retry_after", retry.is_some_and(|i| i.as_micros() < 0)),
        ("reset_after", reset.as_micros() < 0),
    ];
    if let Some((name, _)) = negative.iter().find(|(_, bad)| *bad) {
        return Err(error::invalid_value(
            function,
            format!("decision.{name} must not be negative"),
            hint,
        ));
    }
    Ok((allowed, remaining, reset.as_micros()))
}

/// One column of a `rate_limit.decision` value.
fn field<'t, T>(
    function: &'static str,
    d: &'t PgHeapTuple<'_, AllocatedByRust>,
    name: &str,
) -> Result<Option<T>, ErrorReport>
where
    T: FromDatum + IntoDatum + pgrx::datum::UnboxDatum<As<'t> = T> + 't,
{
    d.get_by_name(name).map_err(|e| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("rate_limit internal error: {e}"),
            function,
        )
    })
}

/// Sleeps up to `us` microseconds on the backend's latch, waking early for interrupts, which are then
/// processed (query cancel and `statement_timeout` raise their errors here).
fn sleep_us(us: i64) {
    let ms = (us.saturating_add(999) / 1000).clamp(1, i64::from(i32::MAX / 2));
    // SAFETY: MyLatch is the backend's own latch, valid for its whole life; WaitLatch and ResetLatch are
    // called from the backend's only thread, as the latch protocol requires (reset, then check for
    // interrupts, then wait again in the caller's loop).
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms as _,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pg_sys::check_for_interrupts!();
}
