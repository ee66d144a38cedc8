//! The SQL calls of the full limiter API: `take` (named policy, ad-hoc, several policies), `peek`, `wait`,
//! `refund`, `reset` of a policy's bucket, and `headers` for HTTP responses.

use std::rc::Rc;

use pgrx::datum::{Interval, JsonB};
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::algorithm::{Algorithm, Outcome};
use crate::clock;
use crate::decision::{self, Decision};
use crate::error::{self, MAX_ID_BYTES};
use crate::gucs::{self, Store};
use crate::policies::{self, Named};
use crate::policy_api::build_policy;
use crate::store::target::{Target, MAX_TARGETS};
use crate::store::{memory, policy_table};

/// The SQL type every call returns.
pub type DecisionRow = PgHeapTuple<'static, AllocatedByRust>;

fn key_arg<'a>(function: &'static str, key: Option<&'a str>) -> Result<&'a str, ErrorReport> {
    let key = key.ok_or_else(|| {
        error::null_argument(
            function,
            "key",
            "Pass the key to limit, such as a user id, an API key or an IP address.",
        )
    })?;
    if key.len() > MAX_ID_BYTES {
        return Err(error::key_too_long(function, "key", key.len()));
    }
    Ok(key)
}

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

fn policy_arg(function: &'static str, name: Option<&str>) -> Result<Rc<Named>, ErrorReport> {
    let name = name.ok_or_else(|| {
        error::null_argument(
            function,
            "policy",
            "Pass the name of a policy from rate_limit.policies.",
        )
    })?;
    policies::get(function, name)
}

fn target<'a>(named: &'a Named, key: &'a str) -> Target<'a> {
    Target {
        policy_name: &named.name,
        created_at: named.created_at,
        key,
        policy: named.policy,
        changed_at: named.changed_at,
    }
}

fn store_of(named: Option<&Named>) -> Store {
    named.and_then(|n| n.store).unwrap_or_else(gucs::store)
}

/// Runs `targets` (all in `store`) for `cost` tokens, all or nothing.
fn run(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<Vec<Outcome>, ErrorReport> {
    match store {
        Store::Table => policy_table::take(function, targets, cost),
        Store::Memory => memory::take_targets(function, targets, cost),
    }
}

fn decide(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<Decision, ErrorReport> {
    let outcomes = run(function, store, targets, cost)?;
    let names: Vec<&str> = targets.iter().map(|t| t.policy_name).collect();
    let limits: Vec<i64> = targets.iter().map(|t| t.policy.burst()).collect();
    Ok(Decision::combine(&names, &limits, &outcomes))
}

/// `take(policy, key, cost)` as a plain decision (also the body of `wait`).
fn take_policy(
    function: &'static str,
    policy: Option<&str>,
    key: Option<&str>,
    cost: Option<i32>,
) -> Result<Decision, ErrorReport> {
    let named = policy_arg(function, policy)?;
    let key = key_arg(function, key)?;
    let cost = cost_arg(function, cost)?;
    decide(
        function,
        store_of(Some(&named)),
        &[target(&named, key)],
        cost,
    )
}

/// Several (policy, key) pairs, validated: not empty, at most [`MAX_TARGETS`], no NULLs, no duplicates,
/// one store.
fn take_pairs(
    function: &'static str,
    policies: Option<Vec<Option<String>>>,
    keys: Vec<Option<String>>,
    cost: Option<i32>,
) -> Result<Decision, ErrorReport> {
    let names = policies.ok_or_else(|| {
        error::null_argument(
            function,
            "policies",
            "Pass an array of policy names, e.g. ARRAY['per_user', 'global'].",
        )
    })?;
    let cost = cost_arg(function, cost)?;
    if names.is_empty() || names.len() > MAX_TARGETS {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "policies must name 1 to {MAX_TARGETS} policies, got {}",
                names.len()
            ),
            function,
        )
        .set_hint("Split the limits over several calls, or combine them in fewer policies."));
    }
    let mut named = Vec::with_capacity(names.len());
    for n in &names {
        named.push(policy_arg(function, n.as_deref())?);
    }
    let mut valid_keys = Vec::with_capacity(keys.len());
    for k in &keys {
        valid_keys.push(key_arg(function, k.as_deref())?);
    }
    let targets: Vec<Target<'_>> = named
        .iter()
        .zip(&valid_keys)
        .map(|(n, k)| target(n, k))
        .collect();
    for (i, t) in targets.iter().enumerate() {
        if targets[..i]
            .iter()
            .any(|o| o.policy_name == t.policy_name && o.key == t.key)
        {
            return Err(ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "policy \"{}\" is named twice for key \"{}\"",
                    t.policy_name, t.key
                ),
                function,
            )
            .set_hint("Name each (policy, key) once; pass a higher cost to take more tokens."));
        }
    }
    let store = store_of(Some(&named[0]));
    if named.iter().any(|n| store_of(Some(n)) != store) {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "the policies of one call must keep their buckets in the same store",
            function,
        )
        .set_detail("All-or-nothing consumption is atomic within one store only.")
        .set_hint("Give the policies the same store (create_policy's store argument), or call take twice."));
    }
    decide(function, store, &targets, cost)
}

fn to_row(function: &'static str, d: &Decision) -> Result<DecisionRow, ErrorReport> {
    decision::to_sql(function, d)
}

/// Calls of the full limiter API, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Takes `cost` tokens (0 only reports) from the bucket of `key` under policy `policy`.
    #[pg_extern(volatile, parallel_unsafe, security_definer, name = "take")]
    #[search_path(pg_catalog, pg_temp)]
    fn take_policy_key(
        policy: Option<&str>,
        key: Option<&str>,
        cost: default!(Option<i32>, 1),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.take";
        to_row(F, &take_policy(F, policy, key, cost)?)
    }

    /// Takes `cost` tokens from the bucket of `key` under an ad-hoc limit: `rate` tokens per `per`, at most
    /// `burst` (default: `rate`), token bucket. Ad-hoc buckets share one namespace, apart from policies'.
    #[pg_extern(volatile, parallel_unsafe, security_definer, name = "take")]
    #[search_path(pg_catalog, pg_temp)]
    fn take_ad_hoc(
        key: Option<&str>,
        rate: Option<i64>,
        per: Option<Interval>,
        burst: default!(Option<i64>, "NULL"),
        cost: default!(Option<i32>, 1),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.take";
        let key = key_arg(F, key)?;
        let rate = rate.ok_or_else(|| {
            error::null_argument(F, "rate", "Pass the tokens granted per period, e.g. 100.")
        })?;
        let per = per.ok_or_else(|| {
            error::null_argument(F, "per", "Pass the period, e.g. interval '1 minute'.")
        })?;
        let cost = cost_arg(F, cost)?;
        let policy = build_policy(F, Algorithm::TokenBucket, rate, per, burst)?;
        let t = Target {
            policy_name: "",
            created_at: 0,
            key,
            policy,
            changed_at: i64::MIN,
        };
        to_row(F, &decide(F, store_of(None), &[t], cost)?)
    }

    /// Takes `cost` tokens from the bucket of `key` under every policy in `policies`, or nothing at all.
    #[pg_extern(volatile, parallel_unsafe, security_definer, name = "take")]
    #[search_path(pg_catalog, pg_temp)]
    fn take_policies_key(
        policies: Option<Vec<Option<String>>>,
        key: Option<&str>,
        cost: default!(Option<i32>, 1),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.take";
        let key = key_arg(F, key)?.to_string();
        let n = policies.as_ref().map_or(0, Vec::len);
        to_row(F, &take_pairs(F, policies, vec![Some(key); n], cost)?)
    }

    /// Takes `cost` tokens from the bucket of `keys[i]` under `policies[i]` for every i, or nothing at
    /// all: per-user, per-organisation and global limits in one atomic call.
    #[pg_extern(volatile, parallel_unsafe, security_definer, name = "take")]
    #[search_path(pg_catalog, pg_temp)]
    fn take_policies_keys(
        policies: Option<Vec<Option<String>>>,
        keys: Option<Vec<Option<String>>>,
        cost: default!(Option<i32>, 1),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.take";
        let keys = keys.ok_or_else(|| {
            error::null_argument(
                F,
                "keys",
                "Pass one key per policy, e.g. ARRAY[user_id, org_id].",
            )
        })?;
        if policies.as_ref().is_some_and(|p| p.len() != keys.len()) {
            return Err(ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "policies and keys must have the same length",
                F,
            )
            .set_hint("Pass one key per policy, in the same order."));
        }
        to_row(F, &take_pairs(F, policies, keys, cost)?)
    }

    /// The bucket of `key` under policy `policy`, without taking anything.
    #[pg_extern(volatile, parallel_unsafe, security_definer, name = "peek")]
    #[search_path(pg_catalog, pg_temp)]
    fn peek_policy_key(
        policy: Option<&str>,
        key: Option<&str>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.peek";
        to_row(F, &take_policy(F, policy, key, Some(0))?)
    }

    /// Waits on the backend's latch until `cost` tokens can be taken, takes them and returns the decision;
    /// gives up, taking nothing, when they cannot be had within `timeout` (NULL: no limit but
    /// `statement_timeout`). Query cancel and `statement_timeout` interrupt the wait.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn wait(
        policy: Option<&str>,
        key: Option<&str>,
        cost: default!(Option<i32>, 1),
        timeout: default!(Option<Interval>, "NULL"),
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.wait";
        let deadline = match timeout {
            None => None,
            Some(t) => {
                if t.months() != 0 || t.as_micros() < 0 {
                    return Err(ErrorReport::new(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        "timeout must be zero or a positive interval without months",
                        F,
                    )
                    .set_hint(
                        "Pass e.g. interval '5 seconds', or NULL to wait until statement_timeout.",
                    ));
                }
                let us = i64::try_from(t.as_micros()).unwrap_or(i64::MAX);
                Some(clock::now_us().saturating_add(us))
            }
        };
        loop {
            let d = take_policy(F, policy, key, cost)?;
            let Some(retry) = d.retry_after.filter(|_| !d.allowed) else {
                return to_row(F, &d); // granted, or can never be
            };
            let now = clock::now_us();
            if deadline.is_some_and(|end| now.saturating_add(retry) > end) {
                return to_row(F, &d); // not within the timeout: give up now, like Go's Limiter.Wait
            }
            sleep_us(retry);
        }
    }

    /// Puts up to `tokens` back into the bucket of `key` under `policy` (never above its burst) and returns
    /// the bucket afterwards. Owner only (GRANT EXECUTE to delegate).
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn refund(
        policy: Option<&str>,
        key: Option<&str>,
        tokens: Option<i64>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.refund";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, key)?;
        let tokens = tokens.ok_or_else(|| {
            error::null_argument(F, "tokens", "Pass the number of tokens to give back.")
        })?;
        if tokens < 0 {
            return Err(error::out_of_range(F, "tokens", tokens, 0, i64::MAX));
        }
        let t = target(&named, key);
        let o = match store_of(Some(&named)) {
            Store::Table => policy_table::refund(F, &t, tokens)?,
            Store::Memory => memory::refund_target(F, &t, tokens)?,
        };
        let d = Decision::combine(&[t.policy_name], &[t.policy.burst()], &[o]);
        to_row(F, &d)
    }

    /// Deletes the bucket of `key` under `policy` (it is full again); true if it existed. Owner only.
    #[pg_extern(volatile, parallel_unsafe, security_definer, name = "reset")]
    #[search_path(pg_catalog, pg_temp)]
    fn reset_policy_key(policy: Option<&str>, key: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.reset";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, key)?;
        match store_of(Some(&named)) {
            Store::Table => policy_table::reset(F, &named.name, key),
            Store::Memory => memory::reset_target(F, &target(&named, key)),
        }
    }

    /// The HTTP response fields for a decision, per the IETF RateLimit header fields draft: `RateLimit`,
    /// `RateLimit-Policy` (when the policy is known) and, when denied, `Retry-After`.
    #[pg_extern(stable, parallel_safe)]
    fn headers(
        decision: Option<pgrx::composite_type!("rate_limit.decision")>,
        policy: default!(Option<&str>, "NULL"),
    ) -> Result<Option<JsonB>, ErrorReport> {
        const F: &str = "rate_limit.headers";
        let Some(d) = decision else {
            return Ok(None);
        };
        let allowed: Option<bool> = field(F, &d, "allowed")?;
        let remaining: Option<i64> = field(F, &d, "remaining")?;
        let limit: Option<i64> = field(F, &d, "limit")?;
        let retry: Option<Interval> = field(F, &d, "retry_after")?;
        let reset: Option<Interval> = field(F, &d, "reset_after")?;
        let named_in: Option<String> = field(F, &d, "policy")?;
        let name = policy.map(str::to_string).or(named_in);
        let named = match name.as_deref() {
            Some(n) => Some(policies::get(F, n)?),
            None => None,
        };
        let fields = crate::http::fields(&crate::http::Input {
            name: name.as_deref(),
            allowed: allowed.unwrap_or(false),
            remaining: remaining.unwrap_or(0),
            limit,
            retry_after_us: retry.map(|i| i.as_micros()),
            reset_after_us: reset.map_or(0, |i| i.as_micros()),
            policy: named.as_deref().map(|n| n.policy),
        });
        Ok(Some(JsonB(fields)))
    }
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
