//! The checks a policy's parameters pass, whether they come from a caller or from a stored row, and the
//! errors (22023, 42809) that say what is wrong with them.

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use super::{Named, MAX_NAME_BYTES};
use crate::error;
use crate::gucs::Store;
use crate::time::calendar;
use rate_limit_model::algorithm::adaptive::AdaptiveError;
use rate_limit_model::algorithm::{
    Adaptive, Algorithm, DebtError, Policy, PolicyError, MAX_BLOCK_US, MAX_HOLD_US, MAX_LEASES,
    MAX_WINDOW_COUNT,
};
use rate_limit_model::target::Blocking;

/// Validates a policy's numbers; `burst` `None` means "the same as rate". `time_zone` and `anchor` (a
/// wall-clock time) belong to calendar windows only, whose zone defaults to [`calendar::DEFAULT_ZONE`] and
/// anchor to the start of their step's unit.
pub fn build(
    function: &'static str,
    algorithm: Algorithm,
    rate: i64,
    per: Interval,
    burst: Option<i64>,
    time_zone: Option<&str>,
    anchor: Option<i64>,
) -> Result<Policy, ErrorReport> {
    if algorithm == Algorithm::CalendarWindow {
        if burst.is_some_and(|b| b != rate) {
            return Err(policy_error(function, PolicyError::WindowBurstNotRate));
        }
        let zone = time_zone.unwrap_or(calendar::DEFAULT_ZONE);
        let calendar = calendar::calendar(function, per, zone, anchor)?;
        return Policy::calendar(rate, calendar).map_err(|e| policy_error(function, e));
    }
    if time_zone.is_some() || anchor.is_some() {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "time_zone and anchor belong to calendar windows, not to algorithm '{}'",
                algorithm.name()
            ),
            function,
        )
        .set_hint(
            "Use algorithm => 'calendar_window' for windows that turn at dates, or omit them.",
        ));
    }
    let period = period_us(function, "per", per)?;
    Policy::new(algorithm, rate, period, burst.unwrap_or(rate))
        .map_err(|e| policy_error(function, e))
}

/// How the keys of `policy` are blocked, with the penalty box `block_after` denials within one of its
/// windows block a key for `block_for`: both NULL (no penalty box: blocks by hand only) or both given
/// (22023 otherwise, and for values out of range); `blocks_by_hand` as the policy's row says.
pub fn blocking(
    function: &'static str,
    policy: &Policy,
    block_after: Option<i64>,
    block_for: Option<Interval>,
    blocks_by_hand: bool,
) -> Result<Blocking, ErrorReport> {
    let hint = "Pass both block_after (denials within one window of the policy) and block_for (how long \
                the key is then blocked), e.g. block_after => 10, block_for => interval '15 minutes'; \
                or neither, for blocks by hand only.";
    let (block_after, penalty_for) = match (block_after, block_for) {
        (None, None) => (None, None),
        (Some(n), Some(d)) => {
            if !(1..=MAX_WINDOW_COUNT).contains(&n) {
                return Err(error::out_of_range(
                    function,
                    "block_after",
                    n,
                    1,
                    MAX_WINDOW_COUNT,
                ));
            }
            (Some(n), Some(block_duration_us(function, "block_for", d)?))
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(error::invalid_value(
                function,
                "block_after and block_for go together".to_string(),
                hint,
            ))
        }
    };
    let bucket = Policy::block_bucket(block_after, policy.period_us())
        .map_err(|e| policy_error(function, e))?;
    Ok(Blocking {
        bucket,
        penalty_for,
        blocks_by_hand,
    })
}

/// A block's length as microseconds: positive, without months, at most 100 years (22023 otherwise).
pub fn block_duration_us(
    function: &'static str,
    argument: &str,
    duration: Interval,
) -> Result<i64, ErrorReport> {
    let us = period_us(function, argument, duration)?;
    if us > MAX_BLOCK_US {
        return Err(error::invalid_value(
            function,
            format!("{argument} must be at most 100 years"),
            "Pass a shorter interval; a key blocked for good is better refused by the application.",
        ));
    }
    Ok(us)
}

/// The adaptive settings of `policy` from its options `adaptive_min` and `latency_target`: none without a
/// latency target; 22023 for a target on another algorithm than a concurrency policy's, a minimum
/// without a target or outside 1..=rate, a target that is not a positive interval without months.
pub fn adaptive(
    function: &'static str,
    policy: &Policy,
    min: Option<i64>,
    target: Option<Interval>,
) -> Result<Option<Adaptive>, ErrorReport> {
    let Some(target) = target else {
        if min.is_some() {
            return Err(error::invalid_value(
                function,
                "policy option \"adaptive_min\" needs \"latency_target\"".to_string(),
                "Make the policy adaptive with options => '{\"latency_target\": \"250 milliseconds\", \"adaptive_min\": 2}', or clear adaptive_min with null.",
            ));
        }
        return Ok(None);
    };
    if policy.algorithm() != Algorithm::Concurrency {
        return Err(error::invalid_value(
            function,
            format!(
                "policy option \"latency_target\" adapts a concurrency policy's leases; this policy's algorithm is {}",
                policy.algorithm().name()
            ),
            "Use it with algorithm => 'concurrency', or clear it with options => '{\"latency_target\": null, \"adaptive_min\": null}'.",
        ));
    }
    let target_us = period_us(function, "latency_target", target)?;
    let min = min.unwrap_or(1);
    Adaptive::new(min, policy.rate(), target_us).map(Some).map_err(|e| {
        let what = match e {
            AdaptiveError::Min => format!(
                "policy option \"adaptive_min\" must be from 1 to the policy's rate ({}), got {min}",
                policy.rate()
            ),
            AdaptiveError::Max => format!("a concurrency policy allows at most {MAX_LEASES} leases"),
            AdaptiveError::Target => "latency_target must be a positive interval".to_string(),
        };
        error::invalid_value(
            function,
            what,
            "The limit of an adaptive policy stays between adaptive_min and the policy's rate (its most leases).",
        )
    })
}

/// A reservation's hold in microseconds: positive, at most [`MAX_HOLD_US`] (one day); 22023 otherwise.
pub fn hold_us(function: &'static str, argument: &str, hold: Interval) -> Result<i64, ErrorReport> {
    let us = period_us(function, argument, hold)?;
    if us > MAX_HOLD_US {
        return Err(error::invalid_value(
            function,
            format!("{argument} must be at most 1 day"),
            "Pass a shorter interval: a reservation not settled by then is settled at its estimate.",
        ));
    }
    Ok(us)
}

/// 42809 for a policy of the wrong kind: a concurrency policy named by a call that takes tokens, or
/// another policy named by `acquire` or `release`.
pub fn wrong_kind(function: &'static str, named: &Named) -> ErrorReport {
    let concurrency = named.policy.algorithm() == Algorithm::Concurrency;
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        if concurrency {
            format!("policy {} limits leases held at once, not tokens", error::quoted(&named.name))
        } else {
            format!("policy {} limits tokens, not leases held at once", error::quoted(&named.name))
        },
        function,
    )
    .set_hint(if concurrency {
        "Take a lease with rate_limit.acquire(policy, key) and give it back with rate_limit.release."
    } else {
        "rate_limit.acquire and release need a policy created with algorithm => 'concurrency'."
    })
}

/// 22023 for parameters that do not make a policy.
pub fn policy_error(function: &'static str, e: PolicyError) -> ErrorReport {
    let hint = match e {
        PolicyError::WindowBurstNotRate => {
            "Omit burst (it defaults to rate), or use algorithm => 'token_bucket' for a burst above the rate."
        }
        PolicyError::WindowTooLarge => "Use a shorter window with a proportionally lower rate.",
        PolicyError::TooManyLeases => "Allow at most 1000 leases per key (rate), or split the key.",
        PolicyError::LeasesBurstNotRate => "Omit burst: rate is the number of leases a key may hold at once.",
        PolicyError::Limit(_) => {
            "Pass rate >= 1, burst >= 1 and a positive per; burst × per (in microseconds) must fit in bigint."
        }
    };
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        e.to_string(),
        function,
    )
    .set_hint(hint)
}

/// 22023 for a `max_debt` the policy's numbers cannot count.
pub fn debt_error(function: &'static str, e: DebtError) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        e.to_string(),
        function,
    )
    .set_hint(
        "max_debt is in tokens: how far below zero rate_limit.charge may drive a bucket (0: not at all).",
    )
}

/// An interval argument as microseconds: positive, and without months (whose length varies).
pub fn period_us(
    function: &'static str,
    argument: &str,
    per: Interval,
) -> Result<i64, ErrorReport> {
    if per.months() != 0 {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{argument} must not contain months or years, whose length varies"),
            function,
        )
        .set_hint(
            "Use days, hours, minutes or seconds, e.g. interval '30 days'; for a quota that resets on \
             the first of the month, create_policy(..., algorithm => 'calendar_window').",
        ));
    }
    let micros = per.as_micros();
    if micros < 1 {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{argument} must be a positive interval"),
            function,
        )
        .set_hint("Pass an interval of at least 1 microsecond, e.g. interval '1 minute'."));
    }
    i64::try_from(micros).map_err(|_| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{argument} is too long"),
            function,
        )
    })
}

/// `'table'` or `'memory'`.
pub fn parse_store(function: &'static str, s: &str) -> Result<Store, ErrorReport> {
    match s {
        "table" => Ok(Store::Table),
        "memory" => Ok(Store::Memory),
        _ => Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "store must be 'table', 'memory' or NULL, got {}",
                error::quoted(s)
            ),
            function,
        )
        .set_hint("NULL follows the rate_limit.store setting of the calling session.")),
    }
}

/// `'token_bucket'` (or `'gcra'`, its other name), `'fixed_window'`, `'sliding_window'`, `'calendar_window'` or
/// `'concurrency'`.
pub fn parse_algorithm(function: &'static str, s: &str) -> Result<Algorithm, ErrorReport> {
    Algorithm::parse(s).filter(|a| a.makes_policies()).ok_or_else(|| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown algorithm {}", error::quoted(s)),
            function,
        )
        .set_hint(
            "Use 'token_bucket' (or 'gcra'), 'fixed_window', 'sliding_window', 'calendar_window' or \
             'concurrency'.",
        )
    })
}

/// A policy name: 1 to [`MAX_NAME_BYTES`] bytes of letters, digits and `_ . : / -`, so that it can be
/// printed unquoted in logs and as an HTTP structured-field string.
pub fn check_name(function: &'static str, name: &str) -> Result<(), ErrorReport> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("invalid policy name {}", error::quoted(name)),
            function,
        )
        .set_hint(format!(
            "Use 1 to {MAX_NAME_BYTES} ASCII letters, digits, '_', '.', ':', '/' or '-'."
        )))
    }
}
